"""The stt families' recipes, from the two modules that make them (split by family, A-L and M-Z
for tts; encoder/CTC/transducer and LLM-decoder families for stt)."""

from zoo.audio import stt_a, stt_b

RECIPES = {**stt_a.RECIPES, **stt_b.RECIPES}
NOT_BUILT = {**stt_a.NOT_BUILT, **stt_b.NOT_BUILT}
