"""GpuDriverFilter: refuses hosts whose vGPU manager cannot run the guest.

The image names its guest's NVIDIA driver branch in the Glance property
``nvidia_guest_driver_branch`` (``R550`` or ``550``); each host's agent
reports its vGPU manager version and the guest branches it supports
(``nvidia`` in the GPU report). The rule is ``nova_gpu.core.drivers``,
the same one the move planner and the live migration pre-check use.
Hosts that report no driver, and images that name no branch, pass. An
image whose branch is malformed is refused everywhere, with an error
naming the image and the value.

Enable it beside GpuFilter::

    [filter_scheduler]
    available_filters = nova_gpu.scheduler.driver_filter.GpuDriverFilter
    enabled_filters = ...,GpuFilter,GpuDriverFilter

Nova keeps only the image properties it knows (``ImageMetaProps``), so
the filter reads the image's own properties from Glance, once per image
per ``IMAGE_TTL`` seconds.
"""

import threading

import cachetools
from nova import context as nova_context
from nova.image import glance
from nova.scheduler import filters
from oslo_log import log as logging

from nova_gpu.core import drivers
from nova_gpu.core import exceptions

LOG = logging.getLogger(__name__)

IMAGE_TTL = 60.0  # seconds an image's branch is remembered
IMAGE_CACHE = 1024  # images remembered


def view_drivers(view, nodename):
    """The ``drivers.DriverInfo`` a host reported, or None.

    The one place this filter reads the scheduler's view: the host entry
    a report made (``view.get``) and the driver info it kept.
    """
    if view is None:
        return None
    entry = view.get(nodename)
    return getattr(entry, 'drivers', None) if entry is not None else None


class GpuDriverFilter(filters.BaseHostFilter):
    """Keep hosts whose vGPU manager supports the image's guest driver."""

    RUN_ON_REBUILD = False
    run_filter_once_per_request = False

    def __init__(self, view=None, drivers_of=None):
        # ``drivers_of(nodename)`` gives a host's DriverInfo; by default
        # the view's (``view_drivers``).
        self._view = view
        self.drivers_of = drivers_of or (
            lambda nodename: view_drivers(self._view, nodename))
        self._images = cachetools.TTLCache(IMAGE_CACHE, IMAGE_TTL)
        self._lock = threading.Lock()

    def host_passes(self, host_state, spec_obj):
        try:
            branch = self.guest_branch(spec_obj)
        except exceptions.InvalidRequest as e:
            LOG.error('GpuDriverFilter: image %s: %s', _image_id(spec_obj),
                      e)
            return False
        if branch is None:
            return True
        try:
            info = self.drivers_of(host_state.nodename)
        except Exception:  # one host's bad state never breaks the rest
            LOG.exception('GpuDriverFilter: driver of %s unknown',
                          host_state.nodename)
            info = None
        problem = drivers.host_problem(info, branch)
        if problem:
            LOG.info('GpuDriverFilter: host %s (%s) refused: %s',
                     host_state.host, host_state.nodename, problem)
            return False
        return True

    def guest_branch(self, spec_obj):
        """The image's guest driver branch ('R550'), or None."""
        image_id = _image_id(spec_obj)
        if not image_id:
            return None
        with self._lock:
            found = self._images.get(image_id, _UNREAD)
        if found is _UNREAD:
            found, read = _image_property(spec_obj, image_id)
            if read:  # a failed read is retried by the next request
                with self._lock:
                    self._images[image_id] = found
        value = found
        if value is None or value == '':
            return None
        try:
            return drivers.parse_branch(value)
        except exceptions.InvalidRequest as e:
            raise exceptions.InvalidRequest('%s: %s' % (
                drivers.IMAGE_PROPERTY, e)) from None


_UNREAD = object()


def _image_id(spec_obj):
    image = getattr(spec_obj, 'image', None)
    if image is None or not image.obj_attr_is_set('id'):
        return None
    return image.id


def _image_property(spec_obj, image_id):
    """(raw ``nvidia_guest_driver_branch`` of an image from Glance, or
    None; whether Glance answered).
    """
    ctxt = getattr(spec_obj, '_context', None) or \
        nova_context.get_admin_context()
    try:
        image = glance.API().get(ctxt, image_id)
    except Exception as e:  # no image service: no branch to enforce
        LOG.warning('GpuDriverFilter: image %s not read (%s); its guest '
                    'driver branch is not checked', image_id, e)
        return None, False
    return (image.get('properties') or {}).get(drivers.IMAGE_PROPERTY), True
