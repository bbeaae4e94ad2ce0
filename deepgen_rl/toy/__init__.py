"""The toy compositional world (grammar, renderer, checker) and the pre-trained toy DeepGen built on it.

See docs/toy_world.md. ``world`` and ``checker`` need only numpy/scipy/PIL; ``model`` builds the toy DeepGen.
"""
