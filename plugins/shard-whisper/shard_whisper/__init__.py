"""shardcore plugin for Whisper (HuggingFace transformers): encoder-decoder speech recognition.

Importing this module is cheap: it registers policy *locations*; ``shard_whisper.policy`` is
imported only when a Whisper model is optimized (and is structural: it imports no transformers).
"""

from shardcore import hookimpl

__version__ = "0.1.0"

MODELS = {
    f"transformers.models.whisper.modeling_whisper.{cls}": "shard_whisper.policy:WhisperPolicy"
    for cls in ("WhisperModel", "WhisperForConditionalGeneration", "WhisperForAudioClassification", "WhisperEncoder")
}


@hookimpl
def shardcore_register_policies(register):
    register(MODELS)
