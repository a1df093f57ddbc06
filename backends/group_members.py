"""Who belongs to a shared cache root's group: :class:`GroupMembers`, asked for each file
owner a shared ``dir://`` cache meets (files of users outside the group are left out of
its size cap)."""

from __future__ import annotations

__all__ = ["GroupMembers"]


class GroupMembers:
    """The users of a shared root's group ``gid``: this process's user, those whose primary
    group it is, and those it lists. Each uid is looked up when a file first names it
    (``pwd.getpwuid``), so users of a directory service that does not list its users
    (LDAP, SSSD without enumeration) count as well; a uid that lookup does not make a
    member is also sought among the listed users (``pwd.getpwall``, once), where an alias
    of it may be. The first :attr:`bound` answers are kept."""

    #: Distinct uids whose answer is kept.
    bound = 4096

    def __init__(self, gid: int, me: int) -> None:
        import grp

        self.gid = gid
        self._known = {me: True}
        self._listed_uids: frozenset[int] | None = None
        try:
            self._names = frozenset(grp.getgrgid(gid).gr_mem)
        except KeyError:  # a gid with no group entry: members by primary group alone
            self._names = frozenset()

    def __contains__(self, uid: object) -> bool:
        if type(uid) is not int:
            return False
        known = self._known.get(uid)
        if known is None:
            import pwd

            try:
                user = pwd.getpwuid(uid)
                known = user.pw_gid == self.gid or user.pw_name in self._names
            except KeyError:  # no such user: nobody's file to count
                known = False
            # A uid with several names (an alias, a "toor") answers with its first alone:
            # the users that are listed are asked too, once.
            known = known or uid in self._listed()
            if len(self._known) < self.bound:
                self._known[uid] = known
        return known

    def _listed(self) -> frozenset[int]:
        # The uids of the users listed (``pwd.getpwall``) that are members.
        if self._listed_uids is None:
            import pwd

            self._listed_uids = frozenset(
                user.pw_uid
                for user in pwd.getpwall()
                if user.pw_gid == self.gid or user.pw_name in self._names
            )
        return self._listed_uids
