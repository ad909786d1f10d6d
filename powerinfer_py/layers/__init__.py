"""Layers the models are built from: the FFN and its sparse modes (ffn, threshold), mixtures of experts (moe)
and the per-sequence state caches (cache). Nothing is imported here, so a model pulls in only the layers it
uses."""
