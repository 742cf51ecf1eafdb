"""Which models form each class of the embedded suites (imported by the suite files).

The session selects models with --models; each suite runs the selected ones that belong to its
class. The classes are chosen so that every shipped gate agrees with the traffic model on two set-ups:

- the emulated cluster (the default): qwen2-tiny computes long enough per step to hide its few
  kilobytes behind the 400 Mbit/s Ethernet link; llama-wide moves tens of megabytes a step and cannot;
- the seed study's cluster: 8 x H100 per node, 8 x 400 Gbit/s InfiniBand (3200 per node) against
  50 Gbit/s Ethernet. There every real model is communication-bound under FSDP on Ethernet (qwen2.5-7b
  at 4 x 2048: predicted ~90% slower with full sharding, ~83% with hybrid at 2 nodes), so none is a
  parity model; all of them must show InfiniBand's advantage.

Check your own cluster before a night: declare its links and a rank's compute throughput and let the
model say which gates it expects to fail (nothing launches):

    pytest suites/ --collect-only --nodes 8 --gpus-per-node 8 --device cuda \
        --fabric-link-gbit ib=3200,eth=400 --fabric-flops 4e14 --models qwen2.5-7b,llama-3.1-70b

Then move models between the classes below (or write your own suite with
``@pytest.mark.fabric_comparison(expect="within")`` / ``expect="ahead"``).
"""

# Compute-bound: many tokens per parameter; a slower fabric hides behind compute.
COMPUTE_BOUND = ["qwen2-tiny"]
# Communication-bound: many parameters for little compute per GPU; the fabric decides.
COMMUNICATION_BOUND = ["llama-wide", "qwen2.5-1.5b", "qwen2.5-7b", "llama-3.1-8b", "qwen2.5-72b", "llama-3.1-70b"]
# Every selected fabric other than the reference (ib) is compared against it: the presets eth, roce,
# efa and any fabric defined in the ini (fabric_define), e.g. `roce-dc2: roce`.
