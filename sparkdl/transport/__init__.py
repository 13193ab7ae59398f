"""How numbers move: the flat vector layout of a model (``flat_layout``), the AllReduce paths
that sum every task's vector in partition order (``allreduce``: a block-sharded shuffle, or a
one-stage sum at the driver), the unpickled byte frames they travel in (``frames``) and the wire
codecs (``codecs``: exact, or gradients rounded to bfloat16).
"""
