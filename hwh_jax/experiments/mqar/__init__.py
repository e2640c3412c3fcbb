"""MQAR as a training task: Zoology's sweep of recall against model width (Arora et al., 2023).

For each architecture and width a 2-layer model (``sweep_config``: ``heads`` heads a layer of
width / heads dimensions, a SwiGLU of 2 x width) is trained on multi-query associative recall
(``hwh_jax.eval.mqar``: keys and values from a vocabulary of 8,192, the value the target at each
query, every other position outside the loss) and scored on fresh sequences of every
(sequence length, key-value pairs) setting. As in Zoology's own configs, one model learns all
settings at once: each batch mixes them (Zoology pads every row to the longest; here each
setting's rows are a group of their own length, the same loss for a causal model at about half
the tokens), and the LM head runs at the query positions only.

Every (seed, learning rate) pair of one architecture and width is one trial, and the trials
train as one program: the step is ``vmap``-ed over their parameters, optimizer states and
learning rates (the data is shared), so a sweep costs one compile per (architecture, width).
As Zoology reports, each seed's score is that of its best learning rate, chosen on a
validation set of other sequences and reported on a test set; a cell is the mean over seeds with
their standard deviation, and the share of test queries answered right pooled over the seeds
with its 95% Wilson interval.

``--mode=zoology`` (``zoology_spec``) is Zoology's own Figure 2 instead (its configs,
``iclr24_zoology_figure2``): a model per (architecture, width, setting), trained on a fixed set
of 100,000 examples of that setting for 64 epochs at Zoology's batch (512 sequences up to
T = 128, 256 at 256, 128 at 512), learning rates 1e-4 to 1e-2 (four, log-spaced), AdamW with
PyTorch's defaults (weight decay 0.01, betas 0.9 / 0.999, no clipping) and a cosine to 0 without
warm-up, no noise tokens between the queries (``random_non_queries=False``), no MLP, and its
heads and positions: attention one head with learned absolute positions, GDN two heads (short
convolution, no positions), HwH one NoPE FA head beside one GDN head. Left from Zoology: its
attention's dropout of 0.1, the BaseConv layer it puts in front of GDN, its cosine stepped once
an epoch (here every step) and its last partial batch of an epoch (dropped here); it picks the
learning rate on its test set, this on a validation set of other sequences.

The modules, each importing only those before it: ``spec`` (the settings and each cell's
model), ``data`` (the sequences), ``train`` (one cell), ``report`` (cells, table, figure),
``sweep`` (every cell, continued and merged).
"""
