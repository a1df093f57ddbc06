"""Many keys that share most of their parts: :class:`KeyTemplate`.

A module's programs differ in a few key parts (the program's name, its source
digest) and share the rest (module id, runtime, purpose, device fingerprint,
options). :func:`~runtime_cache.keys.make_key` walks and encodes every part of
every key; a template walks and encodes the shared parts once, so each key
costs the encoding of its own parts, one hash and the key object.

The keys are byte for byte the ones ``make_key`` gives for the same parts: the
canonical encoding is a list of ``[name, value]`` pairs sorted by name, and a
pair's bytes do not depend on its neighbours
(:func:`~runtime_cache.keys.encoded_part`).

>>> from runtime_cache.keys import make_key
>>> template = KeyTemplate(module_id="m@1", runtime="opencl", purpose="p", device={"n": "N"})
>>> template.key(program="scale") == make_key(
...     module_id="m@1", runtime="opencl", purpose="p", device={"n": "N"}, program="scale")
True
"""

from __future__ import annotations

from typing import Any

import msgpack
import xxhash

from .keys import CacheKey, check_named_parts, encode_parts, encoded_part, make_key, parts_head
from .packing import packb

__all__ = ["MAX_LAYOUTS", "KeyTemplate"]

_PACKER = msgpack.Packer(use_bin_type=True)
#: The msgpack header of a two-item list: a part's ``[name, value]`` pair in the encoding.
_PAIR = _PACKER.pack_array_header(2)

#: A key's parts in name order, for one set of per-key part names: each shared part as
#: ``(name, pair, metadata, copy)``, each per-key one as ``(name, None, packed name, None)``;
#: then the encoding's head and the metadata map's header.
_Layout = tuple[tuple[tuple[str, bytes | None, bytes, Any], ...], bytes, bytes]
#: Layouts a template keeps: a program's keys use one or two sets of per-key names; a
#: caller that names new parts key after key gets each laid out anew past this many.
MAX_LAYOUTS = 32


class KeyTemplate:
    """Makes :class:`~runtime_cache.keys.CacheKey` objects that share most of their parts.

    The arguments are :func:`~runtime_cache.keys.make_key`'s, less the parts that
    differ from key to key, which :meth:`key` takes. A bad shared part raises
    here what ``make_key`` would raise.
    """

    def __init__(
        self, *, module_id: str, runtime: str, purpose: str, device: Any = None, **shared: Any
    ) -> None:
        parts: dict[str, Any] = {
            "module_id": module_id,
            "runtime": runtime,
            "purpose": purpose,
            "device": device,
            **shared,
        }
        check_named_parts(parts)  # the rest is checked as each part is encoded, below
        self._runtime, self._purpose = runtime, purpose
        self._shared = parts
        self._pairs: dict[str, bytes] = {}
        self._copies: dict[str, Any] = {}
        #: Each part as the metadata's msgpack map holds it: its name, then its copy.
        self._meta: dict[str, bytes] = {}
        for name, value in parts.items():
            self._pairs[name], self._copies[name] = encoded_part(name, value)
            self._meta[name] = packb(name) + packb(self._copies[name])
        self._layouts: dict[tuple[str, ...], _Layout | None] = {}

    def key(self, **parts: Any) -> CacheKey:
        """The key of the shared parts plus ``parts``: ``make_key`` of them all.

        A part that would override a shared one, or that ``make_key`` would refuse,
        goes through ``make_key`` itself (which then raises, naming the part).
        """
        names = tuple(parts)
        layout = self._layouts[names] if names in self._layouts else self._lay_out(names)
        if layout is None:  # a shared part overridden
            return make_key(**{**self._shared, **parts})
        order, head, map_header = layout
        pairs: list[bytes] = []
        metas: list[bytes] = []
        copies: dict[str, Any] = {}
        for name, pair, meta, copy in order:
            if pair is None:  # the key's own: a digest or a name, as a rule
                value = parts[name]
                if type(value) is not str:
                    return self._key_of_any(parts)
                meta += _PACKER.pack(value)  # (meta held the packed name)
                pair, copy = _PAIR + meta, value
            pairs.append(pair)
            metas.append(meta)
            copies[name] = copy
        digest = xxhash.xxh3_128_hexdigest(b"".join((head, *pairs)))
        packed = b"".join((map_header, *metas))
        return CacheKey.made(self._runtime, self._purpose, digest, copies, packed)

    def _lay_out(self, names: tuple[str, ...]) -> _Layout | None:
        # The layout of keys whose own parts are ``names`` (None: one is a shared part's).
        if any(name in self._pairs for name in names):
            layout = None
        else:
            order = tuple(
                (name, self._pairs[name], self._meta[name], self._copies[name])
                if name in self._pairs
                else (name, None, _PACKER.pack(name), None)
                for name in sorted((*self._pairs, *names))
            )
            layout = (order, parts_head(len(order)), _PACKER.pack_map_header(len(order)))
        if len(self._layouts) < MAX_LAYOUTS:  # (two threads may lay out the same: alike)
            self._layouts[names] = layout
        return layout

    def _key_of_any(self, parts: dict[str, Any]) -> CacheKey:
        # ``key`` for own parts of any type: each encoded as ``make_key`` encodes it.
        pairs = self._pairs.copy()
        copies = self._copies.copy()
        meta = self._meta.copy()
        for name, value in parts.items():
            if type(value) is str:  # a digest or a name: its pair is its metadata, in a list
                meta[name] = item = _PACKER.pack(name) + _PACKER.pack(value)
                pairs[name], copies[name] = _PAIR + item, value
                continue
            try:
                pairs[name], copies[name] = encoded_part(name, value)
            except TypeError:
                return make_key(**{**self._shared, **parts})
            meta[name] = packb(name) + packb(copies[name])
        digest = xxhash.xxh3_128_hexdigest(encode_parts(pairs))
        # In name order, as make_key keeps them: an entry's metadata holds their msgpack.
        names = sorted(copies)
        ordered = {name: copies[name] for name in names}
        packed = b"".join((_PACKER.pack_map_header(len(names)), *(meta[n] for n in names)))
        return CacheKey.made(self._runtime, self._purpose, digest, ordered, packed)
