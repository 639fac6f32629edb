"""Lightning's FSDPStrategy, the Trainer's and Fabric's, in lit-gpt's
configuration (every transformer Block its own FSDP unit, activation
checkpointing of each, limit_all_gathers) with sharded state dicts: the
strategies of `train_lightning.py --fsdp` and `train_fabric.py --fsdp`.

On a machine without a GPU both strategies run under a subclass: the
Trainer refuses the FSDPStrategy class itself without one (an exact type
check), and both give FSDP no device_id on the CPU, which FSDP then refuses.
The subclass wraps the model as the strategy does, with the CPU as device_id,
and leaves the rest to the strategy. With a GPU, the strategies are
Lightning's own.
"""
import torch
from lightning.fabric.strategies import FSDPStrategy as FabricFSDPStrategy
from lightning.pytorch.strategies import FSDPStrategy as TrainerFSDPStrategy

from train_gpt import Block  # noqa: E402  (beside this script)

LIT_GPT = dict(process_group_backend="gloo", auto_wrap_policy={Block}, activation_checkpointing_policy={Block},
               limit_all_gathers=True, state_dict_type="sharded", sharding_strategy="FULL_SHARD")


def _wrap_on_cpu(strategy, module, fsdp_kwargs):
    """The strategy's own FSDP wrap, with device_id the CPU; its auto-wrap policy is then applied."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    wrapped = FullyShardedDataParallel(module=module, cpu_offload=strategy.cpu_offload,
                                       mixed_precision=strategy.mixed_precision_config,
                                       sharding_strategy=strategy.sharding_strategy, device_id=torch.device("cpu"),
                                       **fsdp_kwargs)
    fsdp_kwargs.pop("auto_wrap_policy", None)  # (the strategy then takes the model as wrapped by the user)
    return wrapped


class _TrainerOnCPU(TrainerFSDPStrategy):
    def _setup_model(self, model):
        return super()._setup_model(_wrap_on_cpu(self, model, self.kwargs))


class _FabricOnCPU(FabricFSDPStrategy):
    def setup_module(self, module):
        return super().setup_module(_wrap_on_cpu(self, module, self._fsdp_kwargs))


def trainer_fsdp():
    return (TrainerFSDPStrategy if torch.cuda.is_available() else _TrainerOnCPU)(**LIT_GPT)


def fabric_fsdp():
    return (FabricFSDPStrategy if torch.cuda.is_available() else _FabricOnCPU)(**LIT_GPT)


def full_weights_digest(fsdp_module, model, digest):
    """digest(model) with every FSDP parameter gathered whole (the same on every rank)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    with FullyShardedDataParallel.summon_full_params(fsdp_module):
        return digest(model)
