"""RabbitMQ for the functional tests.

A test that stops and starts its broker gets its own node (the Debian
package's ``rabbitmq-server -detached``) on free ports, in its own
directory (``PrivateRabbit``). Every other test uses the broker on
127.0.0.1:5672 if one runs, else one private node per test worker
(``SharedOrPrivateRabbit``).
"""

import atexit
import os
import pwd
import shutil
import socket
import subprocess
import tempfile

import fixtures


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


class PrivateRabbit(fixtures.Fixture):
    def _setUp(self):
        for cmd in ('rabbitmq-server', 'rabbitmqctl'):
            if shutil.which(cmd) is None and not os.path.exists(
                    '/usr/sbin/' + cmd):
                raise RuntimeError('%s not found: install rabbitmq-server '
                                   '(bindep.txt)' % cmd)
        if os.geteuid() != 0:
            raise RuntimeError('starting a private RabbitMQ node needs root')
        # In /tmp itself, not $TMPDIR: Nova's test fixtures point that to a
        # per-test directory only root may enter, and the node runs as the
        # rabbitmq user (it could not read its own pid file there).
        self.dir = tempfile.mkdtemp(prefix='ngpu-rmq-', dir='/tmp')
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.port = _free_port()
        self.node = 'ngpu%d@localhost' % self.port
        for sub in ('mnesia', 'log'):
            os.makedirs(os.path.join(self.dir, sub))
        with open(os.path.join(self.dir, 'enabled_plugins'), 'w') as f:
            f.write('[].\n')
        with open(os.path.join(self.dir, 'rabbitmq.conf'), 'w') as f:
            f.write('listeners.tcp.local = 127.0.0.1:%d\n' % self.port)
        try:
            user = pwd.getpwnam('rabbitmq')
            for base, dirs, files in os.walk(self.dir):
                for name in [base] + [os.path.join(base, n)
                                      for n in dirs + files]:
                    os.chown(name, user.pw_uid, user.pw_gid)
        except KeyError:
            pass
        self.env = dict(
            os.environ,
            RABBITMQ_NODENAME=self.node,
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(_free_port()),
            RABBITMQ_MNESIA_BASE=os.path.join(self.dir, 'mnesia'),
            RABBITMQ_LOG_BASE=os.path.join(self.dir, 'log'),
            RABBITMQ_PID_FILE=os.path.join(self.dir, 'pid'),
            RABBITMQ_ENABLED_PLUGINS_FILE=os.path.join(self.dir,
                                                       'enabled_plugins'),
            RABBITMQ_CONFIG_FILE=os.path.join(self.dir, 'rabbitmq'))
        subprocess.run(['rabbitmq-server', '-detached'], env=self.env,
                       check=True, capture_output=True)
        self.addCleanup(self.ctl, 'stop')
        self.ctl('wait', os.path.join(self.dir, 'pid'), '--timeout', '90')
        self.url = 'rabbit://guest:guest@127.0.0.1:%d/' % self.port

    def ctl(self, *args):
        result = subprocess.run(['rabbitmqctl', '-n', self.node] + list(args),
                                env=self.env, capture_output=True,
                                text=True, timeout=120)
        if result.returncode:
            raise RuntimeError('rabbitmqctl %s failed: %s%s'
                               % (' '.join(args), result.stdout,
                                  result.stderr))
        return result.stdout

    def stop_app(self):
        self.ctl('stop_app')

    def start_app(self):
        self.ctl('start_app')


SHARED = ('127.0.0.1', 5672)
SHARED_URL = 'rabbit://guest:guest@%s:%d/' % SHARED

# The private node of this process when no broker is shared: started by
# the first test that needs one, used by every later test of the worker
# (each uses topics of its own), stopped when the worker exits.
_worker_node = []


def shared_up():
    """Whether a broker listens on 127.0.0.1:5672."""
    try:
        socket.create_connection(SHARED, timeout=2).close()
        return True
    except OSError:
        return False


def _stop_worker_node():
    for node in _worker_node:
        node.cleanUp()


class SharedOrPrivateRabbit(fixtures.Fixture):
    """The broker on 127.0.0.1:5672 if one runs, else this worker's own
    private node (a fresh machine runs no RabbitMQ: the tests start what
    they need). ``url`` is its transport URL, ``host`` and ``port`` its
    address.
    """

    def _setUp(self):
        if shared_up():
            self.host, self.port = SHARED
            self.url = SHARED_URL
            return
        if not _worker_node:
            node = PrivateRabbit()
            node.setUp()
            _worker_node.append(node)
            atexit.register(_stop_worker_node)
        node = _worker_node[0]
        self.host, self.port, self.url = '127.0.0.1', node.port, node.url
