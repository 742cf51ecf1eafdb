"""Which models form each class of the embedded suites (imported by the suite files).

The session selects models with --models; each suite runs the selected ones that belong to its
class. Add your own models here (or write your own suite) to gate your cluster.
"""

# Compute-bound: many tokens per parameter; a slower fabric hides behind compute.
COMPUTE_BOUND = ["qwen2-tiny", "qwen2.5-7b", "llama-3.1-8b", "qwen2.5-1.5b"]
# Communication-bound: many parameters for little compute per GPU; the fabric decides.
COMMUNICATION_BOUND = ["llama-wide", "qwen2.5-72b", "llama-3.1-70b"]
# Every selected fabric other than the reference (ib) is compared against it: the presets eth, roce,
# efa and any fabric defined in the ini (fabric_define), e.g. `roce-dc2: roce`.
