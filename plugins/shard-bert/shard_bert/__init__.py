"""shardcore plugin for BERT and RoBERTa (HuggingFace transformers).

Importing this module is cheap: it registers policy *locations*; ``shard_bert.policy`` (and
transformers with it) is imported only when one of these models is optimized.
"""

from shardcore import hookimpl

__version__ = "0.1.0"

#: model class -> policy location
MODELS = {
    "transformers.models.bert.modeling_bert.BertModel": "shard_bert.policy:BertModelPolicy",
    "transformers.models.bert.modeling_bert.BertForPreTraining": "shard_bert.policy:BertWithLMHeadPolicy",
    "transformers.models.bert.modeling_bert.BertForMaskedLM": "shard_bert.policy:BertWithLMHeadPolicy",
    "transformers.models.bert.modeling_bert.BertLMHeadModel": "shard_bert.policy:BertWithLMHeadPolicy",
    "transformers.models.bert.modeling_bert.BertForSequenceClassification": "shard_bert.policy:BertModelPolicy",
    "transformers.models.bert.modeling_bert.BertForTokenClassification": "shard_bert.policy:BertModelPolicy",
    "transformers.models.bert.modeling_bert.BertForQuestionAnswering": "shard_bert.policy:BertModelPolicy",
    "transformers.models.bert.modeling_bert.BertForMultipleChoice": "shard_bert.policy:BertModelPolicy",
    "transformers.models.bert.modeling_bert.BertForNextSentencePrediction": "shard_bert.policy:BertModelPolicy",
    "transformers.models.roberta.modeling_roberta.RobertaModel": "shard_bert.policy:BertModelPolicy",
    "transformers.models.roberta.modeling_roberta.RobertaForMaskedLM": "shard_bert.policy:BertWithLMHeadPolicy",
    "transformers.models.roberta.modeling_roberta.RobertaForSequenceClassification": "shard_bert.policy:BertModelPolicy",
}


@hookimpl
def shardcore_register_policies(register):
    register(MODELS)
