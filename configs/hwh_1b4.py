"""HwH at size 1b4 (configs/base.py, hwh_jax/models/variants.py), pretrained on FineWeb-Edu.

The data block reads FineWeb-Edu's 10B-token sample, tokenised once into token shards in your
data folder (``data.data_dir`` or ``$HWH_DATA_DIR``); online, once:

  huggingface-cli download HuggingFaceFW/fineweb-edu --repo-type=dataset \\
      --include "sample/10BT/*" --local-dir=$HWH_DATA_DIR/fineweb_edu
  python -m launch.prepare_data --input=$HWH_DATA_DIR/fineweb_edu/sample/10BT \\
      --out=$HWH_DATA_DIR/fineweb_edu_10bt_gpt2

20,000 steps of 256 x 2,048 tokens are 10.5B tokens, about one pass over it. The held-out
share is the stream's last 0.05% (about 5M tokens). docs/training.md, "Data at scale".
"""

from configs import base


def get_config():
    config = base.get_config("hwh_1b4")
    d = config.data
    d.source = "shards"
    d.paths = ("fineweb_edu_10bt_gpt2",)
    d.tokenizer = "gpt2"
    d.heldout_fraction = 0.0005
    return config
