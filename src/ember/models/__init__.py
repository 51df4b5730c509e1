"""Models ember trains: the reference zoo and user factories, built by name from a seed.

build_model  zoo.py  a built-in name, "package.module:function" or a model object -> seeded
  torch.nn.Module
MODEL_NAMES  zoo.py  the built-in model names build_model accepts
check_model_object  zoo.py  one clear error for a model= that builds no model
accepted_kwargs  zoo.py  which of input_shape= and num_classes= a model factory takes

imports: config, data, errors
"""

from ember.models.zoo import MODEL_NAMES, accepted_kwargs, build_model, check_model_object

__all__ = ["MODEL_NAMES", "accepted_kwargs", "build_model", "check_model_object"]
