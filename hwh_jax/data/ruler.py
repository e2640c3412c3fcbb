"""RULER's NIAH templates and the needle keys, shared by the NIAH evaluation
(``hwh_jax.eval.niah``) and the synthetic retrieval documents of training
(``hwh_jax.data.retrieval``). Texts verbatim from RULER (``scripts/data/synthetic/constants.py``
and ``niah.py``); the keys are adjective-noun pairs from the short lists below (RULER draws them
from wonderwords' full lists).

RULER's template is plural; where a prompt asks for one value of one key (every niah_single
task, and each question of the training documents), RULER's ``niah.py`` rewrites it to the
singular (``singular``) and drops the "s" of the value type, so the prompt reads "A special
magic number is hidden ... What is the special magic number for K mentioned in the provided
text? The special magic number for K mentioned in the provided text is". ``prompt_template``
gives the template as RULER renders it for a number of asked values.
"""

TEMPLATE = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure "
    "to memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\n"
    "What are all the special magic {type_needle_v} for {query} mentioned in the "
    "provided text?"
)
ANSWER_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
TOKENS_TO_GENERATE = 128  # RULER's generation budget for NIAH (synthetic.yaml), kept free when
#                            sizing a haystack


def singular(template: str) -> str:
    """RULER's rewrite of a template for one asked value (``niah.py``), in its order."""
    for old, new in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
        template = template.replace(old, new)
    return template


def prompt_template(values: int = 1) -> str:
    """Template + answer prefix as RULER renders them for ``values`` asked values."""
    full = TEMPLATE + ANSWER_PREFIX
    return singular(full) if values == 1 else full


def value_type(kind: str, values: int = 1) -> str:
    """The word for the value type ("numbers", "uuids") as the template takes it: singular
    for one asked value. The needles always use the plural, as RULER's do."""
    return kind[:-1] if values == 1 else kind


NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


_ADJECTIVES = """able ancient angry bitter bold brave bright broad calm careful cheap clever cold
cool curious damp dark deep eager early empty fair famous fancy fierce flat fresh gentle giant
glad golden grand green happy heavy hollow honest huge humble icy jolly kind large lazy little
lively loud lucky mellow mighty modern narrow noisy odd old pale plain polite proud quick quiet
rapid rare rich rough round royal rusty sad shiny short silent silly sleepy slow small smooth
soft solid sour spicy steady steep sticky strange strict strong sudden sweet swift tall tame
tender thin tidy tiny tough vast warm wet wide wild wise witty young""".split()
_NOUNS = """anchor apple arrow badge basket beach bell berry blade blanket boat bottle bridge
brush bucket button cabin camera candle canyon carpet castle cave chair cloud coast comet
compass cottage crayon crown desk diamond dragon drum eagle engine falcon feather fence field
flag forest fountain garden gate glacier guitar hammer harbor helmet hill island jacket jewel
kettle kite ladder lake lantern lemon letter lion magnet marble meadow mirror moon mountain
needle ocean orchard owl palace parrot pencil piano pillow planet pocket pond puzzle quilt
rabbit river robot rocket saddle sailor scarf shell shield ship statue storm stream tiger
tower train tunnel umbrella valley violin wagon whale window wizard""".split()
WORDS = sorted({f"{a}-{n}" for a in _ADJECTIVES for n in _NOUNS})
