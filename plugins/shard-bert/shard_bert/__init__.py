"""shardcore plugin for BERT and RoBERTa (HuggingFace transformers).

Importing this module is cheap: it registers policy *locations*; ``shard_bert.policy`` (and
transformers with it) is imported only when one of these models is optimized.
"""

from shardcore import hookimpl

__version__ = "0.1.0"

#: model class -> policy class in shard_bert.policy
MODELS = {
    "transformers.models.bert.modeling_bert.BertModel": "BertModelPolicy",
    "transformers.models.bert.modeling_bert.BertForPreTraining": "BertWithLMHeadPolicy",
    "transformers.models.bert.modeling_bert.BertForMaskedLM": "BertWithLMHeadPolicy",
    "transformers.models.bert.modeling_bert.BertLMHeadModel": "BertWithLMHeadPolicy",
    "transformers.models.bert.modeling_bert.BertForSequenceClassification": "BertModelPolicy",
    "transformers.models.bert.modeling_bert.BertForTokenClassification": "BertModelPolicy",
    "transformers.models.bert.modeling_bert.BertForQuestionAnswering": "BertModelPolicy",
    "transformers.models.bert.modeling_bert.BertForMultipleChoice": "BertModelPolicy",
    "transformers.models.bert.modeling_bert.BertForNextSentencePrediction": "BertModelPolicy",
    "transformers.models.roberta.modeling_roberta.RobertaModel": "BertModelPolicy",
    "transformers.models.roberta.modeling_roberta.RobertaForMaskedLM": "BertWithLMHeadPolicy",
    "transformers.models.roberta.modeling_roberta.RobertaForSequenceClassification": "BertModelPolicy",
}


@hookimpl
def shardcore_register_policies(register):
    for model, policy in MODELS.items():
        register(model, f"shard_bert.policy:{policy}")
