"""`rffm install_profiles`: make `snakemake --profile gcp-batch` and `--profile slurm` work by name.

Snakemake looks a bare profile name up in the current directory, then in the user's config
directory (`$XDG_CONFIG_HOME/snakemake`, default `~/.config/snakemake`), then in the site config
directory. This links `<user config dir>/snakemake/<name>` to this checkout's `profiles/<name>`, so
the profile a user edits in the checkout is the one Snakemake reads (and the one a run records).
Idempotent: a link that already points here is kept; anything else under that name is never replaced, only
reported with its Fix, and the other names are linked all the same.
"""

from __future__ import annotations

import os
from pathlib import Path

PROFILES = ("gcp-batch", "slurm")
CHECKOUT = Path(__file__).resolve().parents[3]


def user_profile_dir() -> Path:
    """Where Snakemake looks up profile names for this user (platformdirs, as Snakemake does)."""
    from platformdirs import user_config_path

    return user_config_path("snakemake", "snakemake")


def describe(path: Path) -> str:
    """What occupies a path, for a refusal message."""
    if path.is_symlink():
        return f"a link to {os.readlink(path)}"
    return "a directory" if path.is_dir() else "a file"


def linked(link: Path, source: Path) -> bool:
    """Whether `link` is a symbolic link to `source`."""
    return link.is_symlink() and Path(os.readlink(link)) == source


def conflict(link: Path, source: Path) -> str | None:
    """Why `link` cannot become a link to `source` (something else is there), or None."""
    if not (source / "config.yaml").is_file():
        return f"{source}/config.yaml does not exist. Fix: run `rffm install_profiles` from an rffm checkout (it links its profiles/)."
    if linked(link, source) or not (link.is_symlink() or link.exists()):
        return None
    return (
        f"{link} is {describe(link)}, not this checkout's profile {source}; left as it is. "
        f"Fix: move it away (mv {link} {link}.old) and run `rffm install_profiles` again, or name the profile by path: "
        f"snakemake --profile {source}"
    )


def install_profiles(
    checkout: str | Path = CHECKOUT, target_dir: str | Path | None = None, names: tuple[str, ...] = PROFILES
) -> tuple[list[str], list[str]]:
    """Link each profile it can into Snakemake's user profile directory: (one line per name linked or already linked,
    one line per name left alone because something else holds it, each with its Fix)."""
    target = Path(target_dir) if target_dir else user_profile_dir()
    done, refused = [], []
    for name in names:
        link, source = target / name, (Path(checkout) / "profiles" / name).resolve()
        # Each name on its own: a site's own `slurm` profile is no reason to leave `gcp-batch` unlinked.
        if problem := conflict(link, source):
            refused.append(problem)
        elif linked(link, source):
            done.append(f"{link} -> {source}: already linked")
        else:
            target.mkdir(parents=True, exist_ok=True)
            link.symlink_to(source, target_is_directory=True)
            done.append(f"{link} -> {source}: linked")
    return done, refused
