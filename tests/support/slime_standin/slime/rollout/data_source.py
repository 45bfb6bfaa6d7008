"""Stand-in copy of ``slime/rollout/data_source.py`` (slime 0.3.1, 624b824a): ``RolloutDataSourceWithBuffer``'s
``get_samples`` / ``add_samples`` / ``get_buffer_length`` and ``pop_first``, as written there. The rows are a list of
prompt ``Sample``s given to the constructor instead of slime's ``Dataset`` (no tokenizer, no shuffle, no
save/load)."""

import copy

from slime.utils.types import Sample


class RolloutDataSourceWithBuffer:
    def __init__(self, args, prompts: list[Sample]):
        self.args = args
        self.epoch_id = 0
        self.sample_group_index = 0
        self.sample_index = 0
        self.sample_offset = 0
        self.prompts = prompts
        self.buffer = []
        self.buffer_filter = pop_first

    def _dataset_samples(self, num_samples):
        # RolloutDataSource.get_samples, over self.prompts
        if self.sample_offset + num_samples <= len(self.prompts):
            prompt_samples = self.prompts[self.sample_offset : self.sample_offset + num_samples]
            self.sample_offset += num_samples
        else:
            prompt_samples = self.prompts[self.sample_offset :]
            num_samples -= len(prompt_samples)
            self.epoch_id += 1
            prompt_samples += self.prompts[:num_samples]
            self.sample_offset = num_samples

        samples = []
        for prompt_sample in prompt_samples:
            group = []
            for _ in range(self.args.n_samples_per_prompt):
                sample = copy.deepcopy(prompt_sample)
                sample.group_index = self.sample_group_index
                sample.index = self.sample_index
                self.sample_index += 1
                group.append(sample)
            self.sample_group_index += 1
            samples.append(group)
        return samples

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        samples = self._get_samples_from_buffer(num_samples)
        num_samples -= len(samples)

        if num_samples == 0:
            return samples

        samples += self._dataset_samples(num_samples=num_samples)
        return samples

    def _get_samples_from_buffer(self, num_samples: int) -> list[list[Sample]]:
        if len(self.buffer) == 0 or num_samples == 0:
            return []

        samples = self.buffer_filter(self.args, None, self.buffer, num_samples)
        return samples

    def add_samples(self, samples: list[list[Sample]]):
        if not samples:
            return
        assert isinstance(samples, list), f"samples must be a list, got {type(samples)}"
        assert isinstance(samples[0], list), f"the elements of samples must be list, got {type(samples[0])}"
        for i in range(0, len(samples)):
            assert len(samples[i]) == self.args.n_samples_per_prompt, (
                "the length of the elements of samples must be equal to n_samples_per_prompt, "
                f"got {len(samples[i])} != {self.args.n_samples_per_prompt}"
            )
            group = samples[i]  # type: ignore
            self.buffer.append(group)

    def get_buffer_length(self):
        return len(self.buffer)

    def __len__(self) -> int:
        return len(self.prompts)


def pop_first(args, rollout_id, buffer: list[list[Sample]], num_samples: int) -> list[list[Sample]]:
    num_to_pop = min(len(buffer), num_samples)
    samples = buffer[:num_to_pop]
    del buffer[:num_to_pop]
    return samples
