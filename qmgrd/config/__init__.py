"""qmgrd configuration: the parameter table, main.cf / master.cf parsing, frozen Config.

Public API (DESIGN §8)::

    cfg = load_config(Path("/etc/qmgrd"))     # ConfigError naming file, line, parameter
    cfg.get_time("maximal_queue_lifetime")    # seconds
    cfg.transport("relay").get_int("destination_concurrency_limit")
"""

from qmgrd.config.config import Config, TransportConfig, compute_defaults, load_config
from qmgrd.config.files import MasterEntry, Setting
from qmgrd.config.params import PARAMS, Param, ParamType, describe, find_param
from qmgrd.config.validate import check_reloadable
from qmgrd.config.values import parse_hostport

__all__ = [
    "PARAMS",
    "Config",
    "MasterEntry",
    "Param",
    "ParamType",
    "Setting",
    "TransportConfig",
    "check_reloadable",
    "compute_defaults",
    "describe",
    "find_param",
    "load_config",
    "parse_hostport",
]
