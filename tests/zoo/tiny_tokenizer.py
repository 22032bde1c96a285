"""A small tokenizer for the zoo's tiny models: a byte-level BPE trained here on a few sentences.

A few hundred tokens keep the embedding and the output head of a tiny model a few KB each
(a real tokenizer's 50k-150k rows would be almost all of its size). Byte-level, so any text
round-trips; ChatML specials, `<|im_end|>` the end of sequence. Trained deterministically:
the same files every time, so the model directories built around it are reproducible.
"""

import json
from pathlib import Path

VOCAB = 384
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS = "<|im_end|>"
# The text matrix's prompts are made of these words; a compact tokenization keeps prompts short.
CORPUS = [
    "one two three four five six seven eight nine ten",
    "The river flows past the old mill. The sky is blue, green today, a clear day.",
    "Numbers: 4, 8, 15, 16, 23, 42. Count 1, 2, 3, 4, 5, 6, 7, 8, 9, 10.",
    "The quick brown fox jumps over the lazy dog. Hello world! How are you today?",
    "system user assistant: the cat sat on the mat while the sun was shining.",
]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def write(target: Path):
    """Train the tokenizer and save it into `target` (tokenizer.json, its config, the chat
    template); returns the transformers tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=SPECIALS[0],
                                   additional_special_tokens=SPECIALS[1:])
    fast.chat_template = CHAT_TEMPLATE
    target.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(target))
    (target / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return fast


def special_ids(target: Path) -> list:
    """The ids of the special tokens in the tokenizer saved in `target`."""
    vocab = json.loads((target / "tokenizer.json").read_text())["model"]["vocab"]
    return sorted(vocab[s] for s in SPECIALS)
