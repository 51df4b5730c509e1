"""Models ember trains: the reference zoo and user factories, built by name from a seed.

build_model  zoo.py  a built-in name or "package.module:function" -> seeded torch.nn.Module
MODEL_NAMES  zoo.py  the built-in model names build_model accepts
register_model, registered_model, model_label  zoo.py  a model object handed to ember.fit

imports: config, data, errors
"""

from ember.models.zoo import (
    MODEL_NAMES,
    OBJECT_PREFIX,
    build_model,
    model_label,
    register_model,
    registered_model,
)

__all__ = [
    "MODEL_NAMES",
    "OBJECT_PREFIX",
    "build_model",
    "model_label",
    "register_model",
    "registered_model",
]
