"""Operator configuration: YAML files merged into click's `default_map`.

Sources, later wins:

    /etc/npusnap/config.yaml
    $XDG_CONFIG_HOME/npusnap/config.yaml   (~/.config/npusnap/config.yaml)
    npusnap --config FILE                  (or NPUSNAP_CONFIG=FILE)
    NPUSNAP_* environment variables        (click's auto_envvar_prefix)
    flags on the command line

The schema is the CLI itself: a top-level key is a command (its value maps the
command's long option names, `-` or `_`, to values; a group nests its
subcommands), a root option (`verbose`), or a global key (`criu`, which sets
--criu for every command that has it):

    criu: /usr/local/sbin/criu
    checkpoint:
      lock_timeout: 120
      device: sim
    device:
      start: {devices: 4, memory: 8G, group: HwHiAiUser}

Every value is checked with the option's own click type, so a config file
accepts exactly what the command line accepts. Unknown keys and bad values are
one `ConfigProblem` line naming the file and the key.

Only the standard library is imported here; PyYAML is imported only when a
config file exists, so `npusnap --help` stays instant.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from .errors import ConfigProblem

if TYPE_CHECKING:
    import click

SYSTEM_CONFIG = Path("/etc/npusnap/config.yaml")
ENV_PREFIX = "NPUSNAP"
CONFIG_ENV = "NPUSNAP_CONFIG"
META_KEY = "npusnap.config"
# Global keys: set the named parameter of every command that has it.
GLOBAL_KEYS = {"criu": "criu_path"}
# Options that make no sense in a file.
NOT_CONFIGURABLE = frozenset({"help", "version", "config", "json_output"})


def user_config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or ""
    root = Path(base) if os.path.isabs(base) else Path.home() / ".config"
    return root / "npusnap" / "config.yaml"


@dataclass
class ConfigFile:
    """A configuration file npusnap looked for, and whether it was read."""

    path: Path
    origin: str      # system | user | --config
    loaded: bool


@dataclass
class Config:
    """The settings read from the configuration files, as click's default_map."""

    files: list[ConfigFile] = field(default_factory=list)
    default_map: dict[str, Any] = field(default_factory=dict)
    # (command path..., parameter name) -> the file that set it
    sources: dict[tuple[str, ...], str] = field(default_factory=dict)


def candidate_files(explicit: Optional[str]) -> list[tuple[Path, str]]:
    files = [(SYSTEM_CONFIG, "system"), (user_config_path(), "user")]
    if explicit:
        files.append((Path(explicit), "--config"))
    return files


def load(ctx: "click.Context", explicit: Optional[str]) -> Config:
    """Read every config file that exists, validate it against the CLI, and set
    ctx.default_map (the root context: subcommands inherit their sections)."""
    cfg = Config()
    layers: list[tuple[Path, Any]] = []
    for path, origin in candidate_files(explicit):
        try:  # an unreadable default location counts as absent; an explicit --config must exist
            exists = path.is_file() if origin != "--config" else True
        except OSError:
            exists = False
        cfg.files.append(ConfigFile(path, origin, exists))
        if exists:
            layers.append((path, _read_yaml(path)))
    for path, data in layers:
        _apply(cfg, ctx, path, data)
    if cfg.default_map:
        ctx.default_map = _merge(dict(ctx.default_map or {}), cfg.default_map)
    ctx.meta[META_KEY] = cfg
    return cfg


# ---------------------------------------------------------------- reading


def _read_yaml(path: Path) -> Any:
    import yaml

    class StrictLoader(yaml.SafeLoader):
        pass

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node)
            if key in seen:
                raise ConfigProblem(f"{path}:{key_node.start_mark.line + 1}: key {key!r} appears twice",
                                    "keep one of them")
            seen.add(key)
        return loader.construct_mapping(node)

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigProblem(f"cannot read config file {path}: {e.strerror}",
                            "fix its permissions or remove it") from e
    except UnicodeDecodeError as e:
        raise ConfigProblem(f"config file {path} is not UTF-8 text") from e
    try:
        data = yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        what = getattr(e, "problem", None) or str(e).split("\n")[0]
        raise ConfigProblem(f"{path}{where}: not valid YAML: {what}") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigProblem(f"{path}: the top level must be a mapping of keys to values, "
                            f"not {type(data).__name__}", "see `npusnap config show` for the keys")
    return data


# ---------------------------------------------------------------- validation


def option_key(param: "click.Parameter") -> Optional[str]:
    """The config key of an option: its first long name, with `_` for `-`."""
    import click

    if not isinstance(param, click.Option) or param.name in NOT_CONFIGURABLE:
        return None
    if param.is_eager and not param.expose_value:  # --help, --version, --json
        return None
    longs = [o for o in param.opts if o.startswith("--")]
    if not longs:
        return param.name
    return longs[0][2:].replace("-", "_")


def configurable_options(cmd: "click.Command") -> dict[str, "click.Option"]:
    import click

    out: dict[str, click.Option] = {}
    for p in cmd.params:
        key = option_key(p)
        if key is not None and isinstance(p, click.Option):
            out[key] = p
    return out


def _apply(cfg: Config, root: "click.Context", path: Path, data: dict[str, Any]) -> None:
    # Global keys first, so a command's own key in the same file wins over them.
    for key, value in data.items():
        if isinstance(key, str) and key.replace("-", "_") in GLOBAL_KEYS and value is not None:
            pname = GLOBAL_KEYS[key.replace("-", "_")]
            if not isinstance(value, str) or not value:
                raise ConfigProblem(f"{path}: {key}: expected a path, got {value!r}")
            for name in _command_names(root):
                cfg.default_map.setdefault(name, {})[pname] = value
                cfg.sources[(name, pname)] = str(path)
    rest = {k: v for k, v in data.items() if not (isinstance(k, str) and k.replace("-", "_") in GLOBAL_KEYS)}
    _apply_section(cfg, root, root.command, (), path, rest, cfg.default_map, top=True)


def _command_names(ctx: "click.Context") -> list[str]:
    import click

    cmd = ctx.command
    return list(cmd.list_commands(ctx)) if isinstance(cmd, click.Group) else []


def _apply_section(cfg: Config, ctx: "click.Context", cmd: "click.Command", prefix: tuple[str, ...],
                   path: Path, data: dict[Any, Any], target: dict[str, Any], top: bool = False) -> None:
    import click

    options = configurable_options(cmd)
    subcommands = cmd.list_commands(ctx) if isinstance(cmd, click.Group) else []
    for key, value in data.items():
        dotted = ".".join((*prefix, str(key)))
        if not isinstance(key, str):
            raise ConfigProblem(f"{path}: {dotted}: keys must be strings")
        norm = key.replace("-", "_")
        sub = next((s for s in subcommands if s.replace("-", "_") == norm), None)
        if sub is not None:
            if value is None:
                continue
            if not isinstance(value, dict):
                raise ConfigProblem(f"{path}: {dotted}: expected a mapping of {sub}'s options, "
                                    f"got {type(value).__name__}",
                                    f"write it as `{sub}: {{option: value}}`")
            try:
                sub_cmd = cmd.get_command(ctx, sub) if isinstance(cmd, click.Group) else None
            except ImportError as e:
                raise ConfigProblem(f"{path}: {dotted}: the {sub} command cannot be loaded ({e})") from e
            if sub_cmd is None:
                continue
            sub_ctx = click.Context(sub_cmd, info_name=sub, parent=ctx, obj=ctx.obj)
            _apply_section(cfg, sub_ctx, sub_cmd, (*prefix, sub), path, value,
                           target.setdefault(sub, {}))
            continue
        param = options.get(norm)
        if param is None:
            known = sorted(set(options) | set(subcommands) | (set(GLOBAL_KEYS) if top else set()))
            import difflib  # an error's hint only

            close = difflib.get_close_matches(norm, known, n=1)
            where = "at the top level" if top else f"for `npusnap {' '.join(prefix)}`"
            hint = f"did you mean {'.'.join((*prefix, close[0]))!r}?" if close else (
                "known keys: " + ", ".join(known) if known else "this command takes no options")
            raise ConfigProblem(f"{path}: {dotted}: unknown key {where}", hint)
        if value is None:      # `key:` with no value leaves the default
            continue
        try:
            param.type_cast_value(click.Context(cmd, info_name=prefix[-1] if prefix else "npusnap"), value)
        except click.BadParameter as e:
            raise ConfigProblem(f"{path}: {dotted}: {e.message}") from None
        except (TypeError, ValueError) as e:
            raise ConfigProblem(f"{path}: {dotted}: invalid value {value!r}: {e}") from None
        if param.multiple and isinstance(value, str):
            value = [value]
        assert param.name is not None
        target[param.name] = value
        cfg.sources[(*prefix, param.name)] = str(path)


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = v
    return base


# ---------------------------------------------------------------- effective values


@dataclass
class Setting:
    """One effective setting, and where its value came from (`npusnap config`)."""

    key: str                  # checkpoint.lock_timeout
    option: str               # --lock-timeout
    value: Any
    source: str               # default | file | env | flag
    origin: Optional[str]     # the file or environment variable, when there is one
    env: str                  # the environment variable that would set it


def effective(root: "click.Context", warn: Any = None) -> list[Setting]:
    """Every configurable option of every command, its effective value and where it came from."""
    import click
    from click.core import ParameterSource

    cfg: Config = root.meta.get(META_KEY) or Config()
    out: list[Setting] = []

    def source_of(ctx: click.Context, param: click.Option, path: tuple[str, ...]) -> tuple[str, Optional[str]]:
        src = ctx.get_parameter_source(param.name or "")
        if src == ParameterSource.COMMANDLINE:
            return "flag", None
        if src == ParameterSource.ENVIRONMENT:
            return "env", _env_name_set(ctx, param)
        if src == ParameterSource.DEFAULT_MAP:
            return "file", cfg.sources.get((*path, param.name or ""))
        return "default", None

    def visit(ctx: click.Context, cmd: click.Command, path: tuple[str, ...]) -> None:
        for key, param in configurable_options(cmd).items():
            if param.name not in ctx.params:
                continue
            value = ctx.params[param.name]
            source, origin = source_of(ctx, param, path)
            out.append(Setting(".".join((*path, key)), param.opts[-1] if param.opts else key,
                               _plain(value), source, origin, env_name(ctx, param)))
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                try:
                    sub = cmd.get_command(ctx, name)
                except ImportError as e:
                    if warn:
                        warn(f"`npusnap {' '.join((*path, name))}` cannot be loaded ({e}); its settings are not shown")
                    continue
                if sub is None:
                    continue
                sub_ctx = sub.make_context(name, [], parent=ctx, resilient_parsing=True, obj=_Scratch())
                visit(sub_ctx, sub, (*path, name))

    visit(root, root.command, ())
    return out


class _Scratch:
    """A stand-in ctx.obj, so option callbacks run for `config show` touch nothing real."""

    json_mode = False
    verbose = False


def env_name(ctx: "click.Context", param: "click.Option") -> str:
    if param.envvar:
        return param.envvar if isinstance(param.envvar, str) else param.envvar[0]
    prefix = ctx.auto_envvar_prefix or ENV_PREFIX
    return f"{prefix}_{(param.name or '').upper()}"


def _env_name_set(ctx: "click.Context", param: "click.Option") -> str:
    names = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or [])
    if ctx.auto_envvar_prefix:
        names.append(f"{ctx.auto_envvar_prefix}_{(param.name or '').upper()}")
    return next((n for n in names if os.environ.get(n)), env_name(ctx, param))


def _plain(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value
