"""Nova's versioned ``compute_task.build_instances.error``, read.

Nova's conductor sends it (priority ERROR, on the versioned notifications
topic) when it cannot build an instance; for a capacity refusal the
reason's ``exception`` is ``NoValidHost`` (``NoValidHost_Remote`` where
the scheduler is another process, as deployed) and the payload carries the
request spec with the flavor and its extra specs::

    {"nova_object.name": "ComputeTaskPayload",
     "nova_object.data": {
        "instance_uuid": "...",
        "reason": {"nova_object.data": {"exception": "NoValidHost", ...}},
        "request_spec": {"nova_object.data": {
            "project_id": "...", "user_id": "...", "num_instances": 1,
            "flavor": {"nova_object.data": {
                "name": "...", "vcpus": 4, "memory_mb": 8192,
                "extra_specs": {"gpu:profile": "A100-10C", ...}}}}}}}

Only what the reclaimer needs is read; anything else, or a malformed
payload, gives None or ``EventError`` naming the field.
"""

import dataclasses

from nova_gpu.core import exceptions

BUILD_ERROR = 'compute_task.build_instances.error'
NO_VALID_HOST = 'NoValidHost'
# oslo.messaging re-raises an exception from another service (here
# nova-scheduler's, over RPC) as a class of that name plus this suffix
# (oslo_messaging/_utils deserialize_remote_exception): in a deployment
# the conductor's reason is "NoValidHost_Remote", in one process
# "NoValidHost".
REMOTE_SUFFIX = '_Remote'


class EventError(exceptions.InvalidRequest):
    """A Nova notification the reclaimer cannot read."""


@dataclasses.dataclass(frozen=True)
class RefusedRequest:
    """An instance Nova refused for capacity, and its flavor."""

    instance_uuid: str
    project_id: str
    user_id: str
    flavor_name: str
    extra_specs: dict
    vcpus: int = 0
    memory_mb: int = 0


def _data(primitive, field):
    if primitive is None:
        return {}
    if not isinstance(primitive, dict):
        raise EventError('%s must be an object' % field)
    data = primitive.get('nova_object.data', primitive)
    if not isinstance(data, dict):
        raise EventError('%s.nova_object.data must be an object' % field)
    return data


def _int(value, field):
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise EventError('%s must be an integer >= 0, got %r'
                         % (field, value))
    return value


def refused_request(payload):
    """The RefusedRequest of a build error payload, or None when the build
    failed for another reason than NoValidHost.
    """
    data = _data(payload, 'payload')
    reason = _data(data.get('reason'), 'reason')
    if reason.get('exception') not in (NO_VALID_HOST,
                                       NO_VALID_HOST + REMOTE_SUFFIX):
        return None
    uuid = data.get('instance_uuid')
    if not isinstance(uuid, str) or not uuid:
        raise EventError('instance_uuid must be a non-empty string')
    spec = _data(data.get('request_spec'), 'request_spec')
    flavor = _data(spec.get('flavor'), 'request_spec.flavor')
    specs = flavor.get('extra_specs') or {}
    if not isinstance(specs, dict) or not all(
            isinstance(k, str) and isinstance(v, str)
            for k, v in specs.items()):
        raise EventError('request_spec.flavor.extra_specs must map '
                         'strings to strings')
    return RefusedRequest(
        uuid, spec.get('project_id'), spec.get('user_id'),
        flavor.get('name'), dict(specs),
        _int(flavor.get('vcpus'), 'flavor.vcpus'),
        _int(flavor.get('memory_mb'), 'flavor.memory_mb'))
