"""Serving a trained run: a TensorFlow SavedModel from raw columns to the click probability.

:mod:`embtrain.serving.tf_ops` holds the TensorFlow versions of training's string hash and
initializer, :mod:`embtrain.serving.graph` the module a SavedModel holds, and
:mod:`embtrain.serving.export` writes it from a run's checkpoint.

Layer: above ``train`` (it reads a run directory through :mod:`embtrain.train.predict` and the
recipe translation of :mod:`embtrain.embedding.from_recipe`), below ``cli``.
"""
