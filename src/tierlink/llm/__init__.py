"""Generative language models on tierlink nodes.

``weights`` finds and installs the models (offline, from installed packages), ``model`` is a
Llama-family decoder with a per-sequence KV cache (``kvcache``) whose logits do not depend on
what a row is batched with, ``sampling`` decodes (greedy, temperature, top-p, seeds) and holds
the speculative acceptance rule, ``text`` tokenizes and renders chat templates, ``engine``
batches the steps of concurrent sequences continuously, ``card`` measures an LM's card.
Nothing here runs at import time; torch is imported only by the modules that compute.
"""
