"""Selection policies, one module each, all behind ``memento.policy.Policy``.

Planned (selector-core issue): ``random``, ``similarity`` (non-parametric CBR), ``soft_q``
(parametric CBR), ``linucb``; later ``cfgm``, ``lifemem``, ``plugmem``. Nothing here yet.
"""
