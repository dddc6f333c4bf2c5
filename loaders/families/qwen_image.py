"""Family module for qwen_image (placeholder interface until its owner fills it in)."""

FAMILY = "qwen_image"
MODEL_FAMILIES = ("qwen_image",)


def recognizes(lora):
    return False


def prepare(lora, model_family):
    return lora


def map_target(name):
    return name


def expected_unmatched_reason(name, model_family):
    return None


def declared_contract(file_name, metadata, rank):
    return None


def checkpoint_contract(model_index, model_name):
    return None
