"""Mutants of shard-bert: each a deliberate bug one declared check must catch (tests/mutant_kit.py)."""

from mutant_kit import m

MUTANTS = [
    m(
        "bert-region-entry-dropped",
        "BERT's self-attention not entered into the TP region: q, k, v's input gradient never summed",
        "plugins/shard-bert/shard_bert/policy.py",
        "BertPolicy.module_policy",
        [('                enter_tp_region=["attention.self"],\n', "")],
        "plugins/shard-bert/tests/test_bert_tp.py::test_bert_classes[BertModel-2]",
        "BertModelPolicy: 'attention.self.query' of BertLayer is built with copy_input=False",
    ),
    m(
        "bert-registers-nothing",
        "shard-bert's hook registers no model: its models fall to zero-config or are refused",
        "plugins/shard-bert/shard_bert/__init__.py",
        "shardcore_register_policies",
        [("    register(MODELS)", "    register({})")],
        "plugins/shard-bert/tests/test_bert_tp.py::test_bert_classes[BertModel-2]",
        "covers transformers.models.bert.modeling_bert.BertModel",
    ),
]
