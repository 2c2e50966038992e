"""Refusal codes and keys of model servers, spelled exactly as the source documents spell them."""

NO_ELIGIBLE_NODE = "NO_ELIGIBLE_NODE"
CAPACITY_CONSTRAINED = "CAPACITY_CONSTRAINED"
UNKNOWN_RUNTIME_PROFILE = "UNKNOWN_RUNTIME_PROFILE"
INVALID_SERVER_STATE = "INVALID_SERVER_STATE"

# Remote starts refused outright (lower-case keys, as the seed's table has them).
LLAMACPP_REMOTE_UNSUPPORTED = "llamacpp_remote_unsupported"
MODEL_NOT_PRESENT_ON_NODE = "model_not_present_on_node"
INSUFFICIENT_SHARED_MEMORY = "insufficient_shared_memory"
ENCRYPTED_WEIGHTS_LOCAL_ONLY = "encrypted_weights_local_only"
LOCAL_NODE_ONLY = "LOCAL_NODE_ONLY"

# A server whose node went offline is marked so in the books.
NODE_OFFLINE = "NODE_OFFLINE"
LAUNCH_FAILED = "LAUNCH_FAILED"
PROCESS_LOST = "PROCESS_LOST"
STOP_FAILED = "STOP_FAILED"
ARTIFACT_NOT_READY = "ARTIFACT_NOT_READY"

# Alerts: a failed server (warning); cleared when it runs again or is deleted.
ALERT_SERVER_FAILED = "SERVER_FAILED"
