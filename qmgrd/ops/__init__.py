"""Operator commands: the CLI side of running qmgrd (Postfix's postqueue, postsuper, qshape).

Modules and the commands they implement (each ``*_command`` returns an exit
code: 0 success, 1 operator error, 2 usage error):

- ``client``: ``call(path, request) -> dict`` over the control socket
  (``qmgrd.daemon.control``); ``DaemonNotRunning``, ``ControlError``.
- ``postsuper``: ``operate_command`` for ``hold|release|delete|requeue``,
  through the daemon when it runs, on the spool (``offline_operate``) when not.
- ``qshape``: ``compute_shape`` / ``format_shape`` / ``qshape_command``.
- ``status``: ``flush_command``, ``scan_command``, ``status_command``,
  ``format_status``.

Nothing here writes the spool while a daemon answers on its control socket.
"""
