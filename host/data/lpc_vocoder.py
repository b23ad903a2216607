"""Voice conversion by LPC analysis and resynthesis: ``edge.adapt.vocoder`` (numpy only, so a device
makes the federated word copies with it too), re-exported for the host's experiments
(``scripts/custom_stages.py --converted``). ``voiceconv.py`` does this with the WORLD vocoder, but
pyworld compiles on install, so it stays a tool for experiments.

    >>> y = convert(x, f0_scale=1.2, formant_scale=1.08, buzz=True)   # float 16 kHz in and out
"""

from edge.adapt.vocoder import convert, levinson, random_convert  # noqa: F401
