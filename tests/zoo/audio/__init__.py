"""The audio family matrix's models: every speech-to-text, text-to-speech and voice-activity
family of the installed mlx-audio, built tiny with its own classes (families.py, builder.py,
and one recipe module per kind)."""
