# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""An unsharded ``ngram_embedding.weight`` of the wrong width must not load.

``VocabParallelEmbedding.weight_loader`` checks only the row count, so a
table one column wide was broadcast across every column of this rank's
shard and the model served garbage embeddings. ``PLEVocabParallelEmbedding``
must refuse it at load time, naming both shapes, before any copy.

Both the NVIDIA and the AMD ``Qwen4ExpNGramEmbedding`` route the unsharded
name through the embedding's own weight loader, so both are exercised. The
TP rank seam is explained in conftest.py.
"""

import pytest
import torch

PLATFORMS = ["amd", "nvidia"]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("width", [1, 2])
def test_unsharded_table_of_wrong_width_is_a_load_error(parallel_rank, ple_builders, platform, width):
    parallel_rank(rank=1, world_size=2)
    module = ple_builders.by_platform[platform](ple_builders.config())
    embedding = module.ngram_embedding
    embedding.weight.data.fill_(-7.0)
    table = ple_builders.complete_table(module)
    narrow = table[:, :width].contiguous()

    with pytest.raises(ValueError) as excinfo:
        module.load_weights([("ngram_embedding.weight", narrow)])

    message = str(excinfo.value)
    assert str(tuple(table.shape)) in message
    assert str(tuple(narrow.shape)) in message
    assert torch.all(embedding.weight == -7.0)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("rank", [0, 1])
def test_unsharded_table_of_the_right_shape_still_loads(parallel_rank, ple_builders, platform, rank):
    parallel_rank(rank=rank, world_size=2)
    module = ple_builders.by_platform[platform](ple_builders.config())
    table = ple_builders.complete_table(module)

    loaded = module.load_weights([("ngram_embedding.weight", table)])

    assert loaded == {"ngram_embedding.weight"}
    torch.testing.assert_close(module.ngram_embedding.weight, table[rank * 8 : (rank + 1) * 8])
