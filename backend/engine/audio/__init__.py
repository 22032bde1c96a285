"""Audio models' work on the engine thread: jobs (jobs.py) run the library's own generation
(calls.py), taking turns with one another (turns.py) in the scheduler's audio queue (engine/audio_queue.py)."""

from engine.audio.jobs import AudioDone, AudioJob, AudioPart

__all__ = ["AudioDone", "AudioJob", "AudioPart"]
