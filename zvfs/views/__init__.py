"""Views: the virtual tree a mount serves, as nodes (see :mod:`zvfs.views.node`).

The raw tree (:mod:`.raw`), the ``.zvfs`` root (:mod:`.root`), and the decoded
views under it: ``arrays/`` (:mod:`.arrays`, :mod:`.npy`, :mod:`.envi`),
``v2/`` (:mod:`.v2mirror`), ``vectors/`` (:mod:`.vectors`) and ``stats.json``
(:mod:`.stats`). A new output format is one new node class here.
"""
