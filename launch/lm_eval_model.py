"""``RunLM``: lm-eval's model "hwh", a ``launch.train`` run (``pretrained=RUN[,step=N]``)
loaded and scored by ``hwh_jax.eval.harness.HwhLM``. Imported by ``launch.lm_eval.register``
after the process set-up: a class at module level, found (and pickled) by its module path."""

from hwh_jax.eval.harness import HwhLM
from hwh_jax.training.restore import load_run


class RunLM(HwhLM):
    """A trained run as lm-eval's model: ``--model_args pretrained=RUN[,step=N,max_length=L]``."""

    @classmethod
    def create_from_arg_obj(cls, arg_dict, additional_config=None):
        return cls.create_from_arg_string(arg_dict, additional_config)

    @classmethod
    def create_from_arg_string(cls, arg_string, additional_config=None):
        args = HwhLM.parse_args(arg_string, additional_config)
        if not args.get("checkpoint"):
            raise ValueError("--model_args pretrained=RUN is needed (a launch.train workdir)")
        step = args.pop("step", None)
        run = load_run(args.pop("checkpoint"), None if step in (None, "") else int(step))
        return cls(model=run.model, tokenizer=run.tokenizer, **args)
