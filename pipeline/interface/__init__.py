"""Level-1 interface checks: what an architecture can represent, by exact algebra on timm modules.

``nullspace`` (patch null space, collision pairs, patchify == convolution), ``permutation`` (content-only
attention is permutation equivariant; an absolute position signal breaks it), ``pairs`` (candidate
query-key pairs, formula vs timm's Swin masks), ``reachability`` (measured token graphs: the layer at which
two pixels can first interact), ``checks`` (the recorded comparisons), ``study`` (all of it from
``Params``), ``report`` (Markdown and figures).
"""
