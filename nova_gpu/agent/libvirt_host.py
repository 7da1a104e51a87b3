"""The agent's view of libvirtd: node devices (mdevs) and domains.

Persistent mdevs go through libvirt's node-device API (define, create,
autostart; libvirtd runs mdevctl), so Nova's libvirt driver sees and reuses
them. Calls that fail because libvirtd is unreachable are retried on a
fresh connection a few times, then reported as ``Unavailable``.
"""

import time

from oslo_log import log as logging
import tenacity

from nova_gpu.agent import errors
from nova_gpu.agent import xmlbuild

LOG = logging.getLogger(__name__)

try:
    import libvirt
except ImportError:  # the agent can still run discovery without it
    libvirt = None
else:
    # Errors reach the agent as exceptions with clear messages; keep
    # libvirt from also printing every one of them on stderr.
    libvirt.registerErrorHandler(lambda ctx, err: None, None)


class _Unreachable(Exception):
    """libvirtd did not answer (retried); ``cause`` says why."""

    def __init__(self, cause):
        super().__init__(str(cause))
        self.cause = cause


def _is_connection_error(exc):
    code = exc.get_error_code()
    return code in {getattr(libvirt, n) for n in
                    ('VIR_ERR_SYSTEM_ERROR', 'VIR_ERR_NO_CONNECT',
                     'VIR_ERR_RPC')} or (
        exc.get_error_domain() in (libvirt.VIR_FROM_RPC,
                                   libvirt.VIR_FROM_REMOTE))


def _explain(exc):
    msg = exc.get_error_message() or str(exc)
    if 'mdevctl' in msg and ('not found' in msg.lower()
                             or 'cannot find' in msg.lower()
                             or 'no such file' in msg.lower()):
        return errors.Unavailable('mdevctl is not installed on this host '
                                  '(libvirtd needs it for mdevs): %s' % msg)
    return None


class LibvirtHost:
    def __init__(self, uri='qemu:///system', retries=3, retry_delay=0.5,
                 settle_timeout=10.0):
        if libvirt is None:
            raise errors.Unavailable('libvirt-python is not installed')
        self.uri = uri
        self.retries = retries
        self.retry_delay = retry_delay
        self.settle_timeout = settle_timeout
        self._conn = None

    def _connect(self):
        if self._conn is not None:
            try:
                if self._conn.isAlive():
                    return self._conn
            except libvirt.libvirtError:
                pass
            self._conn = None
        self._conn = libvirt.open(self.uri)
        return self._conn

    def call(self, what, fn):
        """Run ``fn(conn)``; reconnect and retry while libvirtd is away."""
        def once():
            try:
                return fn(self._connect())
            except libvirt.libvirtError as e:
                special = _explain(e)
                if special:
                    raise special from e
                if not _is_connection_error(e) and self._conn_alive():
                    raise errors.AgentError('%s failed: %s' % (
                        what, e.get_error_message() or e)) from e
                self._conn = None
                raise _Unreachable(e) from e

        def warn(state):
            LOG.warning('libvirt at %s unreachable during %s (%s); '
                        'retrying', self.uri, what,
                        state.outcome.exception().cause)
        try:
            return tenacity.Retrying(
                retry=tenacity.retry_if_exception_type(_Unreachable),
                stop=tenacity.stop_after_attempt(self.retries + 1),
                wait=tenacity.wait_incrementing(self.retry_delay,
                                                self.retry_delay),
                before_sleep=warn, reraise=True)(once)
        except _Unreachable as e:
            raise errors.Unavailable(
                'libvirtd at %s is not reachable (%s): %s'
                % (self.uri, what, e.cause)) from e.cause

    def _conn_alive(self):
        if self._conn is None:
            return False
        try:
            return bool(self._conn.isAlive())
        except libvirt.libvirtError:
            return False

    def close(self):
        if self._conn is not None:
            try:
                self._conn.close()
            except libvirt.libvirtError:
                pass
            self._conn = None

    # -- node devices -----------------------------------------------------

    def mdevs(self):
        """Every mdev libvirt knows, active or only defined, by UUID."""
        def list_(conn):
            result = {}
            for dev in conn.listAllDevices(
                    libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV):
                try:
                    info = xmlbuild.nodedev_info(dev.XMLDesc(0))
                    info['active'] = bool(dev.isActive())
                    info['persistent'] = bool(dev.isPersistent())
                    info['autostart'] = bool(dev.autostart())
                except libvirt.libvirtError as e:
                    # gone between listing and asking: not there any more
                    if e.get_error_code() == libvirt.VIR_ERR_NO_NODE_DEVICE:
                        continue
                    raise
                result[info['uuid']] = info
            return result
        return self.call('listing mdevs', list_)

    def pci_devices(self):
        def list_(conn):
            result = []
            for d in conn.listAllDevices(
                    libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_PCI_DEV):
                try:
                    result.append(xmlbuild.nodedev_info(d.XMLDesc(0)))
                except libvirt.libvirtError as e:
                    if e.get_error_code() != libvirt.VIR_ERR_NO_NODE_DEVICE:
                        raise
            return result
        return self.call('listing PCI devices', list_)

    def define_mdev(self, parent_address, type_id, uuid):
        xml = xmlbuild.mdev_nodedev(parent_address, type_id, uuid)
        return self.call('defining mdev %s' % uuid,
                         lambda c: c.nodeDeviceDefineXML(xml, 0).name())

    def create_transient_mdev(self, parent_address, type_id, uuid):
        """Start an mdev without a definition (``mdevctl start``); its
        node-device name.
        """
        xml = xmlbuild.mdev_nodedev(parent_address, type_id, uuid)
        return self.call('starting transient mdev %s' % uuid,
                         lambda c: c.nodeDeviceCreateXML(xml, 0).name())

    def _settled(self, fn):
        """Run ``fn`` again while libvirt's mdev list settles.

        libvirtd re-reads mdevctl's definitions some time after each
        change in /etc/mdevctl.d; meanwhile a device that was just defined
        can briefly be missing from its list, or be listed as transient
        (then setting autostart is refused as an invalid operation).
        """
        transient = (libvirt.VIR_ERR_NO_NODE_DEVICE,
                     libvirt.VIR_ERR_OPERATION_INVALID)

        def run(conn):
            deadline = time.monotonic() + self.settle_timeout
            while True:
                try:
                    return fn(conn)
                except libvirt.libvirtError as e:
                    if (e.get_error_code() not in transient
                            or time.monotonic() > deadline):
                        raise
                time.sleep(0.02)
        return run

    def start_device(self, name, autostart=True):
        def start(conn):
            dev = conn.nodeDeviceLookupByName(name)
            if not dev.isActive():
                dev.create(0)
            if autostart and not dev.autostart():
                dev.setAutostart(1)
        self.call('starting %s' % name, self._settled(start))

    def stop_device(self, name):
        def stop(conn):
            dev = conn.nodeDeviceLookupByName(name)
            if dev.isActive():
                dev.destroy()
        self.call('stopping %s' % name, self._settled(stop))

    def undefine_device(self, name):
        def undefine(conn):
            try:
                dev = conn.nodeDeviceLookupByName(name)
            except libvirt.libvirtError as e:
                # gone since it was listed (libvirt dropped it once mdevctl
                # no longer defined it): nothing is left to undefine
                if e.get_error_code() == libvirt.VIR_ERR_NO_NODE_DEVICE:
                    return
                raise
            if dev.isPersistent():
                dev.undefine(0)
            # Wait until libvirt has re-read mdevctl's definitions, so that
            # callers (and the next reconcile) see the device gone.
            deadline = time.monotonic() + self.settle_timeout
            while time.monotonic() < deadline:
                try:
                    dev = conn.nodeDeviceLookupByName(name)
                    if not dev.isPersistent():
                        return
                except libvirt.libvirtError as e:
                    if e.get_error_code() == libvirt.VIR_ERR_NO_NODE_DEVICE:
                        return
                    raise
                time.sleep(0.02)
        self.call('undefining %s' % name, self._settled(undefine))

    def define_existing(self, info):
        """Make an active transient mdev persistent (adoption)."""
        parent = info.get('parent_addr')
        return self.define_mdev(parent, info['mdev_type'], info['uuid'])

    # -- domains ----------------------------------------------------------

    def domains(self, what='listing domains'):
        """``[(name, UUID, [XML, ...])]`` of every domain libvirt knows,
        running or only defined: the live XML, and the persistent one of
        a running persistent domain (the next boot's devices).
        """
        def scan(conn):
            found = []
            for dom in conn.listAllDomains(0):
                try:
                    docs = [dom.XMLDesc(0)]
                    if dom.isActive() and dom.isPersistent():
                        docs.append(dom.XMLDesc(
                            libvirt.VIR_DOMAIN_XML_INACTIVE))
                    found.append((dom.name(), dom.UUIDString(), docs))
                except libvirt.libvirtError as e:
                    if e.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                        continue  # undefined meanwhile
                    raise
            return found
        return self.call(what, scan)

    def domain_refs(self, by='name'):
        """{mdev UUID or PCI address: [domains]} over every domain libvirt
        knows, running or only defined, live and persistent XML.

        ``by``: the domains' names, or (``'uuid'``) their UUIDs, which
        Nova gives its instances' domains.
        """
        refs = {}
        for name, uuid, docs in self.domains():
            domain = uuid if by == 'uuid' else name
            for doc in docs:
                uuids, addrs = xmlbuild.hostdev_refs(doc)
                for key in uuids | addrs:
                    names = refs.setdefault(key, [])
                    if domain not in names:
                        names.append(domain)
        return refs

    def _domain(self, conn, name):
        try:
            return conn.lookupByName(name)
        except libvirt.libvirtError as e:
            if e.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                raise errors.NotFound('no libvirt domain named %r' % name)
            raise

    def attach(self, domain, hostdev_xml):
        self._change_device('attaching a device to %s' % domain, domain,
                            hostdev_xml, 'attachDeviceFlags')

    def detach(self, domain, hostdev_xml):
        self._change_device('detaching a device from %s' % domain, domain,
                            hostdev_xml, 'detachDeviceFlags')

    def _change_device(self, what, domain, hostdev_xml, method):
        """Apply to the persistent definition, and live when running."""
        def change(conn):
            dom = self._domain(conn, domain)
            flags = libvirt.VIR_DOMAIN_AFFECT_CONFIG
            if dom.isActive():
                flags |= libvirt.VIR_DOMAIN_AFFECT_LIVE
            getattr(dom, method)(hostdev_xml, flags)
        self.call(what, change)
