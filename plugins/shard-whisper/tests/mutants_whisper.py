"""Mutants of shard-whisper: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "whisper-decoder-left-whole",
        "Whisper's structural probe finds the encoder layers only (the decoder stays whole)",
        "plugins/shard-whisper/shard_whisper/policy.py",
        "_is_layer",
        [
            (
                '    return hasattr(module, "self_attn") and hasattr(module, "fc1")',
                '    return hasattr(module, "self_attn") and hasattr(module, "fc1") and not hasattr(module, "encoder_attn")',
            )
        ],
        "plugins/shard-whisper/tests/test_whisper_tp.py::test_whisper_classes[WhisperModel-2]",
        "of the unsharded parameter bytes, >",
    ),
    m(
        "whisper-registers-nothing",
        "shard-whisper's hook registers no model: its models fall to zero-config or are refused",
        "plugins/shard-whisper/shard_whisper/__init__.py",
        "shardcore_register_policies",
        [("    register(MODELS)", "    register({})")],
        "plugins/shard-whisper/tests/test_whisper_tp.py::test_whisper_classes[WhisperModel-2]",
        "covers transformers.models.whisper.modeling_whisper.WhisperModel",
    ),
]
