"""Word lists: the 35 Speech Commands words, the 12-class task, fillers and custom phrases.

Fillers feed the ``_unknown_`` class. Custom phrases are never trained on; later
stages enrol them few-shot. Neither list holds a homophone of a keyword
("know", "write", "for", "won", "to"), which would be label noise.
"""

SPEECH_COMMANDS = [
    "backward", "bed", "bird", "cat", "dog", "down", "eight", "five", "follow",
    "forward", "four", "go", "happy", "house", "learn", "left", "marvin", "nine",
    "no", "off", "on", "one", "right", "seven", "sheila", "six", "stop", "three",
    "tree", "two", "up", "visual", "wow", "yes", "zero",
]

COMMANDS10 = ["yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go"]
SILENCE = "_silence_"
UNKNOWN = "_unknown_"

# The model's classes: the 35 words, then silence and unknown.
LABELS = SPEECH_COMMANDS + [SILENCE, UNKNOWN]
# The 12-class evaluation task (MLPerf Tiny / "Hello Edge").
LABELS12 = COMMANDS10 + [UNKNOWN, SILENCE]

FILLERS = [
    "apple", "table", "water", "music", "window", "paper", "orange", "river",
    "garden", "coffee", "purple", "morning", "yellow", "number", "little",
    "hello", "never", "over", "under", "about", "maybe", "thanks", "please",
    "sorry", "kitchen", "doctor", "pencil", "monkey", "silver", "winter",
    "summer", "rabbit", "candle", "basket", "button", "camera", "letter",
    "market", "planet", "rocket", "shadow", "sugar", "ticket", "village",
    "wonder", "jacket", "lemon", "mirror", "pepper", "salad", "bottle",
    "carpet", "dinner", "finger", "guitar", "hammer", "island", "ladder",
    "napkin", "tiger",
]

# Custom keywords for few-shot enrolment: never in training.
CUSTOM_PHRASES = [
    "hey edge", "banana", "jupiter", "computer", "open sesame", "pineapple",
    "blueberry", "good night", "hey robot", "lantern", "velvet", "volcano",
    "cinnamon", "octopus", "thunder", "umbrella", "popcorn", "saturday",
    "dolphin", "magnet",
]

# Near misses of each custom keyword (the few-shot bench's hardest negatives) and everyday short
# phrases (the runs its negative stream is made of): evaluation words, like CUSTOM_PHRASES. They
# live here, not in bench/, because the phone model's vocabulary (host/data/phone_words.txt,
# scripts/phone_words.py) must leave every one of them out and host never reads bench.
NEAR_MISS = {
    "hey edge": ["hey", "edge", "hedge", "hey ed", "hey eddie"], "banana": ["bandana", "nana", "ban a car"],
    "jupiter": ["jupe", "super", "jubilee"], "computer": ["commuter", "compute", "come pewter"],
    "open sesame": ["open", "sesame seed", "open the same"], "pineapple": ["pine", "apple", "pine needle"],
    "blueberry": ["blue", "berry", "blue ferry"], "good night": ["good", "good knight", "goodnight moon"],
    "hey robot": ["robot", "hey rob", "hey bob"], "lantern": ["lanterns", "land turn", "lantana"],
    "velvet": ["velvet rope", "vel", "helmet"], "volcano": ["vulcan", "volcanic", "balcony"],
    "cinnamon": ["cinema", "synonym", "cinnamon roll"], "octopus": ["octopi", "octave", "platypus"],
    "thunder": ["under", "thunderbolt", "hunter"], "umbrella": ["umbra", "bella", "umbrage"],
    "popcorn": ["pop", "corn", "pop gun"], "saturday": ["saturn", "sunday", "satur"],
    "dolphin": ["dolphins", "doll fin", "golfing"], "magnet": ["magnets", "mag net", "magnify"],
}
RUNS = ["the", "and then", "I think", "over there", "a little", "right now", "you know", "maybe later",
        "not yet", "come here", "thank you", "it is"]


def label12(word: str) -> str:
    """Map a model label (one of LABELS) onto the 12-class task."""
    if word in COMMANDS10 or word == SILENCE:
        return word
    return UNKNOWN
