"""Family module for wan (placeholder interface until its owner fills it in)."""

FAMILY = "wan"
MODEL_FAMILIES = ("wan2.1", "wan2.2_moe")


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
