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


def label12(word: str) -> str:
    """Map a model label (one of LABELS) onto the 12-class task."""
    if word in COMMANDS10 or word == SILENCE:
        return word
    return UNKNOWN
