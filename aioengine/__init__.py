"""aioengine: an asyncio-native dependency engine.

Push functions together with the Vars they read (``const_vars``) and mutate
(``mutate_vars``); the engine runs them as soon as their Vars allow, in parallel where it can,
and guarantees one rule: two operations of which at least one mutates a common Var run in the
order they were pushed.
"""

from .blocking import BlockingEngine as BlockingEngine
from .blocking import run as run
from .bulk import Bulk as Bulk
from .context import Context as Context
from .context import DeviceType as DeviceType
from .context import RunContext as RunContext
from .context import cpu as cpu
from .context import gpu as gpu
from .context import remote as remote
from .engine import Engine as Engine
from .errors import Abort as Abort
from .errors import DependencyError as DependencyError
from .errors import DeviceFailedError as DeviceFailedError
from .errors import DeviceUnavailableError as DeviceUnavailableError
from .errors import EngineClosedError as EngineClosedError
from .errors import EngineError as EngineError
from .errors import OperatorDeletedError as OperatorDeletedError
from .errors import VarDeletedError as VarDeletedError
from .executors.cupy_streams import CupyBackend as CupyBackend
from .executors.cupy_streams import gpu_available as gpu_available
from .executors.device import DeviceBackend as DeviceBackend
from .executors.device import StreamFamily as StreamFamily
from .executors.simulated import SimulatedDeviceError as SimulatedDeviceError
from .executors.simulated import SimulatedGPU as SimulatedGPU
from .kinds import FnProperty as FnProperty
from .kinds import OpState as OpState
from .observe.dump import Dump as Dump
from .observe.graph import Graph as Graph
from .observe.stats import EngineStatistics as EngineStatistics
from .observe.stats import PoolStatistics as PoolStatistics
from .observe.timeline import Timeline as Timeline
from .operation import OnComplete as OnComplete
from .operation import Operation as Operation
from .operation import OprHandle as OprHandle
from .var import Var as Var
from .var import VarStatistics as VarStatistics

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # ``ae.array`` without ``import aioengine.array``: the arrays are a front end above the
    # engine, imported on first use (importing aioengine does not load them).
    if name == "array":
        import importlib

        return importlib.import_module(".array", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = (
    "Abort",
    "BlockingEngine",
    "Bulk",
    "Context",
    "CupyBackend",
    "DependencyError",
    "DeviceBackend",
    "DeviceFailedError",
    "DeviceType",
    "DeviceUnavailableError",
    "Dump",
    "Engine",
    "EngineClosedError",
    "EngineError",
    "EngineStatistics",
    "FnProperty",
    "Graph",
    "OnComplete",
    "OpState",
    "Operation",
    "OperatorDeletedError",
    "OprHandle",
    "PoolStatistics",
    "RunContext",
    "SimulatedDeviceError",
    "SimulatedGPU",
    "StreamFamily",
    "Timeline",
    "Var",
    "VarDeletedError",
    "VarStatistics",
    "cpu",
    "gpu",
    "gpu_available",
    "remote",
    "run",
)
