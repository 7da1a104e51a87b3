"""The reclaimer's versioned notifications, in nova-gpu's wire form.

Sent with oslo.messaging (``messagingv2``, priority INFO) on
``[gpu_reclaimer] report_topic``, beside the other nova-gpu notifications
(``nova_gpu.core.notification`` has the wire form and the versioning
rule; ``nova_gpu.owner_notice`` sends them with the server metadata key),
so that a portal or mail bridge can tell owners:

* ``gpu.reclaim.notice``: a spot server will be evicted at ``evict_at``
  (UTC, ISO 8601), and how (``action``);
* ``gpu.reclaim.evicted``: it was;
* ``gpu.reclaim.room``: room was made for a refused on-demand instance;
  its owner (or the portal) boots it again (Nova cannot reschedule an
  instance that NoValidHost put in ERROR).
"""

import dataclasses

from nova_gpu.core import notification
from nova_gpu import owner_notice

PUBLISHER = 'nova-gpu-reclaimer'
NOTICE_EVENT = 'gpu.reclaim.notice'
EVICTED_EVENT = 'gpu.reclaim.evicted'
ROOM_EVENT = 'gpu.reclaim.room'
EVENT_TYPES = (NOTICE_EVENT, EVICTED_EVENT, ROOM_EVENT)


@dataclasses.dataclass(frozen=True)
class NoticePayload(notification.Payload):
    NAME = 'GpuReclaimNoticePayload'

    instance_uuid: str
    action: str                 # shelve_offload or delete
    evict_at: str               # ISO 8601, UTC
    project_id: str = None
    user_id: str = None
    host: str = None
    trigger: str = None         # request or headroom
    why: str = None             # the plan's line for this eviction


@dataclasses.dataclass(frozen=True)
class EvictedPayload(notification.Payload):
    NAME = 'GpuReclaimEvictedPayload'

    instance_uuid: str
    action: str
    project_id: str = None
    user_id: str = None
    host: str = None


@dataclasses.dataclass(frozen=True)
class RoomPayload(notification.Payload):
    NAME = 'GpuReclaimRoomPayload'

    instance_uuid: str          # the refused on-demand instance
    evicted: list = ()          # spot instances evicted for it
    project_id: str = None
    user_id: str = None
    host: str = None            # where the room was made


EVENTS = {NoticePayload: NOTICE_EVENT, EvictedPayload: EVICTED_EVENT,
          RoomPayload: ROOM_EVENT}


def Notifier(notifier):
    """The reclaimer's sender (``owner_notice.Notifier``) of these
    payloads through an oslo.messaging ``Notifier`` (or any object with
    ``info(ctxt, event_type, payload)``).
    """
    return owner_notice.Notifier(notifier, EVENTS)
