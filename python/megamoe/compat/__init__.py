"""Other libraries' interfaces on megamoe's kernels, for code written against them.

- :mod:`megamoe.compat.hybrid_ep`: ``HybridEPBuffer``, the buffer class of DeepEP's HybridEP
  with the constructor and methods Megatron-Core's flex token dispatcher calls
  (``moe_flex_dispatcher_backend='hybridep'``), on megamoe's dispatch/combine.
- :mod:`megamoe.compat.deep_ep_switch`: the switch that makes ``import deep_ep`` find that class
  (``python -m megamoe.compat install-deep-ep``; ``uninstall-deep-ep`` removes it; ``status``
  says which ``deep_ep`` Python finds). It refuses to shadow an installed DeepEP.

Importing this package needs neither torch nor a GPU; ``hybrid_ep``'s buffer imports torch on
first use.
"""
