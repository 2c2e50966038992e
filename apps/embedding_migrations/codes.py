"""Codes of the embedding-migrations domain, spelled as the source documents spell them."""

# The refusal the seeds name: the embedding space changed and the data behind the alias was not
# reindexed and verified in the new one.
REQUIRES_REINDEX = "REQUIRES_REINDEX"

# Alerts.
CUTOVER_INTERRUPTED = "CUTOVER_INTERRUPTED"  # a stage that touches the store stopped mid-way
CUTOVER_FAILED = "CUTOVER_FAILED"  # a stage ended in a named failure (verification, the store)

# Refusals of the API.
CUTOVER_STAGE_CONFLICT = "CUTOVER_STAGE_CONFLICT"  # the action does not apply to the recorded stage
CUTOVER_IN_PROGRESS = "CUTOVER_IN_PROGRESS"  # another cutover of the alias is not finished
EMBEDDING_SPACE_UNKNOWN = "EMBEDDING_SPACE_UNKNOWN"  # a capability's space is not recorded yet
ALIAS_NOT_ON_TARGET = "ALIAS_NOT_ON_TARGET"  # "complete" while the store's alias points elsewhere
STORE_UNAVAILABLE = "STORE_UNAVAILABLE"

# Why a stage failed (Cutover.failure_code).
VERIFICATION_FAILED = "VERIFICATION_FAILED"
EMBEDDING_FAILED = "EMBEDDING_FAILED"
