"""RULER's niah_single templates and the needle keys, shared by the NIAH evaluation
(``hwh_jax.eval.niah``) and the synthetic retrieval documents of training
(``hwh_jax.data.retrieval``). Texts verbatim from RULER (``scripts/data/synthetic/constants.py``
and ``niah.py``); the keys are adjective-noun pairs from the short lists below (RULER draws them
from wonderwords' full lists).
"""

TEMPLATE = ("Some special magic {type_needle_v} are hidden within the following text. Make sure "
            "to memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\n"
            "What are all the special magic {type_needle_v} for {query} mentioned in the "
            "provided text?")
ANSWER_PREFIX = " The special magic {type_needle_v1} for {query} mentioned in the provided text is"
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
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
