"""What ``tuiwatch run`` puts on classes the script defines or imports after it began, and takes off at its end."""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader

from tuiwatch.integrations.loss import on_new_subclasses
from tuiwatch.integrations.script import ScriptWatch


class Base:
    made: list[tuple[type, dict[str, Any]]] = []

    def __init_subclass__(cls, **kwargs: Any) -> None:
        Base.made.append((cls, kwargs))


def test_each_subclass_defined_later_is_found_and_the_bases_own_hook_still_runs():
    found: list[type] = []
    stop = on_new_subclasses(Base, found.append)

    class One(Base, tag="a"):
        pass

    class Two(One):
        pass

    stop()

    class Three(Base):
        pass

    assert found == [One, Two]
    assert Base.made[-3:] == [(One, {"tag": "a"}), (Two, {}), (Three, {})]
    assert "__init_subclass__" in vars(Base)  # its own, put back


def test_a_finder_that_fails_never_fails_the_class_and_a_generic_base_stays_generic():
    def fails(cls: type) -> None:
        raise RuntimeError("not the class's failure")

    stop = on_new_subclasses(DataLoader, fails)
    try:

        class Loader(DataLoader[int]):
            pass

    finally:
        stop()
    assert "__init_subclass__" not in vars(DataLoader)  # inherited from Generic again
    assert Loader.__orig_bases__[0] == DataLoader[int]  # type: ignore[attr-defined]  # (Generic's hook ran)


def test_a_resumable_loader_defined_during_the_run_gets_the_recorder_until_the_run_ends():
    script = ScriptWatch()
    script.install()
    try:

        class Resumable(DataLoader[Any]):
            def __iter__(self) -> Any:
                return super().__iter__()

            def state_dict(self) -> dict[str, Any]:
                return {}

            def load_state_dict(self, state: dict[str, Any]) -> None:
                pass

        class Generator(Resumable):  # a generator over an iterator it holds: its ids come otherwise
            def __iter__(self) -> Any:
                yield from ()

        original = Generator.__iter__
        assert Resumable.__iter__.__qualname__.startswith("ScriptWatch._iter")
        assert Generator.__iter__ is original
        loader = Resumable(list(range(8)), batch_size=4)  # type: ignore[arg-type]  # (a list is a dataset)
        it = iter(loader)
        assert [len(b) for b in it] == [4, 4]
        assert script._recorders[it].recorded is loader.batch_sampler  # its iterator's ids were recorded
    finally:
        script.remove()
    assert Resumable.__iter__.__qualname__.endswith("<locals>.Resumable.__iter__")  # its own again
    assert "__init_subclass__" not in vars(DataLoader)
