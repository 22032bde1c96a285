"""The tts families' recipes, from the two modules that make them (split by family, A-L and M-Z
for tts; encoder/CTC/transducer and LLM-decoder families for stt)."""

from zoo.audio import tts_a, tts_b

RECIPES = {**tts_a.RECIPES, **tts_b.RECIPES}
NOT_BUILT = {**tts_a.NOT_BUILT, **tts_b.NOT_BUILT}
