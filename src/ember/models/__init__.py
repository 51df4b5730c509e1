"""Models ember trains: the reference zoo and user factories, built by name from a seed.

build_model  zoo.py  mlp, logreg, lenet or "package.module:function" -> seeded torch.nn.Module
MODEL_NAMES  zoo.py  the built-in model names build_model accepts
"""

from ember.models.zoo import MODEL_NAMES, build_model

__all__ = ["MODEL_NAMES", "build_model"]
