"""The Lua scripts of every primitive (text only: the backends run them), one module per
primitive; :mod:`.mutex` also holds the fragments the others build on."""
