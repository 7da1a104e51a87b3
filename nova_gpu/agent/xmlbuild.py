"""Node-device and domain XML for GPU devices, built with an XML library.

Names come from flavors, config and sysfs. Each is checked against what a
well-formed value looks like (a clear error names a bad one) and is then
placed with lxml as text or attribute value, so even a hostile value
cannot change the structure of the document.
"""

import re

from lxml import etree

from nova_gpu.agent import errors
from nova_gpu.agent import sysfs

# \A...\Z: '$' would also match before a trailing newline.
MDEV_TYPE_RE = re.compile(r'\A[A-Za-z0-9][A-Za-z0-9_.:+-]{0,63}\Z')
NODEDEV_NAME_RE = re.compile(r'\A[A-Za-z0-9_]{1,128}\Z')


def check(value, pattern, what):
    if not isinstance(value, str) or not pattern.match(value):
        raise errors.InvalidName('invalid %s %r: must match %s'
                                 % (what, value, pattern.pattern))
    return value


def check_uuid(value):
    if isinstance(value, str):
        value = value.lower()
    return check(value, sysfs.UUID_RE, 'mdev UUID')


def check_pci(value):
    return check(value, sysfs.PCI_ADDR_RE, 'PCI address')


def nodedev_name(pci_address):
    """libvirt's node-device name of a PCI function: ``pci_0000_3b_00_0``."""
    return 'pci_' + re.sub(r'[^0-9a-f]', '_', check_pci(pci_address))


def _tostring(root):
    return etree.tostring(root, encoding='unicode')


def mdev_nodedev(parent_address, type_id, uuid):
    """``virNodeDeviceDefineXML`` (persistent) or ``virNodeDeviceCreateXML``
    (transient) document of an mdev.
    """
    dev = etree.Element('device')
    etree.SubElement(dev, 'parent').text = nodedev_name(parent_address)
    cap = etree.SubElement(dev, 'capability', type='mdev')
    etree.SubElement(cap, 'type',
                     id=check(type_id, MDEV_TYPE_RE, 'mdev type'))
    etree.SubElement(cap, 'uuid').text = check_uuid(uuid)
    return _tostring(dev)


def mdev_hostdev(uuid, display=False):
    """Domain ``<hostdev>`` of an mdev (what Nova's libvirt driver writes)."""
    hostdev = etree.Element('hostdev', mode='subsystem', type='mdev',
                            model='vfio-pci',
                            display='on' if display else 'off')
    source = etree.SubElement(hostdev, 'source')
    etree.SubElement(source, 'address', uuid=check_uuid(uuid))
    return _tostring(hostdev)


def pci_hostdev(address, managed=True):
    """Domain ``<hostdev>`` of a whole PCI function through VFIO."""
    domain, bus, slot_fn = check_pci(address).split(':')
    slot, function = slot_fn.split('.')
    hostdev = etree.Element('hostdev', mode='subsystem', type='pci',
                            managed='yes' if managed else 'no')
    etree.SubElement(hostdev, 'driver', name='vfio')
    source = etree.SubElement(hostdev, 'source')
    etree.SubElement(source, 'address', domain='0x' + domain,
                     bus='0x' + bus, slot='0x' + slot,
                     function='0x' + function)
    return _tostring(hostdev)


def parse(text, what='XML'):
    try:
        return etree.fromstring(text.encode() if isinstance(text, str)
                                else text)
    except etree.XMLSyntaxError as e:
        raise errors.AgentError('malformed %s: %s' % (what, e)) from e


def hostdev_refs(domain_xml):
    """(mdev UUIDs, PCI addresses) that a domain XML document references."""
    root = parse(domain_xml, 'domain XML')
    uuids, addresses = set(), set()
    for hostdev in root.iter('hostdev'):
        addr = hostdev.find('source/address')
        if addr is None:
            continue
        if hostdev.get('type') == 'mdev' and addr.get('uuid'):
            uuids.add(addr.get('uuid').lower())
        elif hostdev.get('type') == 'pci':
            try:
                addresses.add('%04x:%02x:%02x.%x' % tuple(
                    int(addr.get(k), 0) for k in
                    ('domain', 'bus', 'slot', 'function')))
            except (TypeError, ValueError):
                continue
    return uuids, addresses


def nodedev_info(xml):
    """Fields of a node-device XML that the agent uses."""
    root = parse(xml, 'node device XML')
    info = {'name': root.findtext('name'), 'parent': root.findtext('parent'),
            'path': root.findtext('path'), 'driver': root.findtext(
                'driver/name')}
    cap = root.find('capability')
    info['type'] = cap.get('type') if cap is not None else None
    if info['type'] == 'mdev':
        info['uuid'] = (cap.findtext('uuid') or '').lower()
        type_el = cap.find('type')
        info['mdev_type'] = type_el.get('id') if type_el is not None \
            else None
        info['parent_addr'] = cap.findtext('parent_addr')
    return info
