"""The small-scale reproduction of docs/results.md: the paper's claims at the `small` size.

``--config=configs/experiment.py:ARCH[,L]`` with ARCH one of ``ARCHS`` below (the `small`
size, parameters matched by hwh_jax.models.variants) or a form of the mixer zoo with its
values joined by "/" (``configs/zoo.py``'s FORM,KIND[,R] as FORM/KIND[/R]:
``layerwise/gla/3`` = 3 GLA layers : 1 RoPE FA layer, ``hwh/mamba2`` = HwH's allocation with
Mamba-2 linear heads, ``pure/hgrn2``), and L the training length (default 512). Every
experiment sees the same tokens: 67 public-domain books
(the shipped ``gutenberg/``) through a SentencePiece vocabulary trained on it, 600 steps of
64 sequences of 512 tokens (19.7M tokens), half of the sequences synthetic retrieval
documents in RULER's NIAH format (1-8 needles, all asked for, the answers' value tokens
weighted 50 in the loss), at most L long, with book haystacks (``hwh_jax/data/retrieval.py``):
retrieval does not emerge from 20M tokens of books, nor with unweighted synthetic documents
(every model scored 0; docs/results.md). It ends
with the retrieval probe (teacher-forced, on synthetic documents from held-out books), NIAH
single 1/2/3 at L, 2L and 4L (essay and noise haystacks, never trained on), MQAR and
perplexity by position up to 4L. Override any field on the command line.

``ARCH,L,cpu`` (e.g. ``hwh,256,cpu``) is the same experiment sized for a CPU, to try the
pipeline before renting an accelerator: the `tiny` size, 300 steps of 16 sequences of L
tokens, NIAH at L and 2L over 3 depths x 2 samples, MQAR on 64 examples, perplexity up to 2L;
about 9 minutes on two CPU cores at L = 256 (docs/results.md). Its numbers say the pipeline
runs, not how the architectures compare.
"""

from configs import base, zoo
from hwh_jax.models import variants

ARCHS = variants.ARCHS  # every architecture of the study (hwh_jax/models/variants.py)


def get_config(arg: str = "hwh"):
    arch, _, rest = arg.partition(",")
    length, _, preset = rest.partition(",")
    if preset not in ("", "cpu"):
        raise ValueError(
            f"configs/experiment.py:{arg}: the third value is {preset!r}; the one "
            f"preset is 'cpu' (ARCH,L,cpu)"
        )
    size = "tiny" if preset == "cpu" else "small"
    if "/" in arch:  # a zoo form: FORM/KIND[/R]
        try:
            config = zoo.get_config(",".join(arch.split("/")) + f",{size}")
        except ValueError as e:
            raise ValueError(f"configs/experiment.py:{arg}: {e}") from None
    elif arch in ARCHS:
        config = base.get_config(f"{arch}_{size}")
    else:
        raise ValueError(
            f"experiment arch {arch!r} is not one of {ARCHS} nor a zoo form "
            f"FORM/KIND[/R] (configs/zoo.py)"
        )
    config.unlock()
    L = int(length or 512)
    config.seq_len = L
    d = config.data
    d.paths = ("gutenberg/gutenberg_train.txt.gz",)
    d.heldout_paths = ("gutenberg/gutenberg_valid.txt.gz",)
    d.tokenizer = "train_sentencepiece"
    d.retrieval_share = 0.5  # synthetic NIAH-format sequences (hwh_jax/data/retrieval.py)
    d.retrieval_answer_weight = 50.0  # unweighted answers: nothing learned (docs/results.md)
    d.retrieval_max_needles = 8
    d.workers = 4  # batches in 4 processes: one process cannot feed a GPU here
    #                            (docs/results.md)
    config.model.vocab_size = 0
    t = config.train
    t.steps, t.batch_size = 600, 64 * 512 // L
    t.warmup_steps, t.lr = 60, 1e-3
    t.document_mask = False  # as the committed measurements were trained
    t.grad_accum = 4  # micro-batches of 8,192 tokens wherever a run trains, however many share
    #                            a GPU: held-out losses were seen to follow the split the memory
    #                            planner chose (docs/results.md, "Held-out loss and the split")
    t.log_every, t.eval_every, t.checkpoint_every = 50, 0, 600  # held-out loss at the end
    e = config.eval
    e.at_end = True
    e.suites = ("retrieval", "niah", "mqar", "ppl")
    e.niah_factors = (1, 2, 4)
    e.niah_depths = 5
    e.ppl_factor = 4
    e.niah_samples = 7  # 35 prompts a (task, length) cell, 105 over the 3 seeds of
    #                            --seeds=0,1,2: intervals of about +-10 points
    e.batch_size = 16
    if preset == "cpu":
        d.workers = 0
        t.steps, t.batch_size, t.warmup_steps, t.lr = 300, 16, 30, 3e-3
        t.grad_accum = 0  # the fewest micro-batches that fit
        t.log_every, t.checkpoint_every = 25, 300
        e.niah_factors, e.niah_depths, e.niah_samples, e.ppl_factor = (1, 2), 3, 2, 2
        e.mqar_examples, e.retrieval_documents, e.ppl_windows = 64, 32, 16
    config.lock()
    return config
