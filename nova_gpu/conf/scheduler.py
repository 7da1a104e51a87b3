"""Options of the nova-gpu scheduler side: ``[gpu_scheduler]``.

They are read by the filter and weighers running inside nova-scheduler, so
they go in nova.conf next to ``[filter_scheduler]``.
"""

from oslo_config import cfg

from nova_gpu.core import notification
from nova_gpu.core import report

group = cfg.OptGroup(
    'gpu_scheduler', title='nova-gpu scheduler filter and weighers',
    help='Options of nova_gpu.scheduler.filters.GpuFilter and the '
         'nova_gpu.scheduler.weighers classes, read by nova-scheduler.')

opts = [
    cfg.FloatOpt('fragmentation_weight_multiplier', default=1.0,
                 help='Multiplier of GpuFragmentationWeigher. Positive '
                      'values prefer hosts where the request grows the '
                      'expected GPU fragmentation least (packing); negative '
                      'values invert it. Overridable per aggregate with the '
                      'metadata key gpu_fragmentation_weight_multiplier.'),
    cfg.FloatOpt('topology_weight_multiplier', default=1.0,
                 help='Multiplier of GpuTopologyWeigher. Positive values '
                      'prefer hosts whose best GPU set is better connected '
                      '(NVLink, one PCIe switch, one NUMA node) and whose '
                      'GPUs share a NUMA node with the pinned CPUs. '
                      'Overridable per aggregate with the metadata key '
                      'gpu_topology_weight_multiplier.'),
    cfg.StrOpt('vgpu_resource_class', default='VGPU',
               help='Placement resource class of one vGPU or MIG-backed '
                    'vGPU, as the compute nodes report it (Nova libvirt '
                    'reports VGPU unless [mdev_*] mdev_class says '
                    'otherwise).'),
    cfg.StrOpt('whole_gpu_resource_class', default=report.WHOLE_GPU_RC,
               help='Placement resource class of one whole (passthrough) '
                    'GPU: the resource_class the compute nodes\' [pci] '
                    'device_spec gives the GPUs (PCI in Placement; Nova '
                    'publishes no PGPU inventory itself), and the one of '
                    'the [pci] alias whole_gpu_alias names.'),
    cfg.StrOpt('whole_gpu_alias', default=report.WHOLE_GPU_ALIAS,
               help='Name of the [pci] alias (in nova.conf of nova-api and '
                    'the compute nodes) that asks for whole GPUs: flavors '
                    'with gpu:kind=whole carry pci_passthrough:alias='
                    '<this>:<count>. Its resource_class must be '
                    'whole_gpu_resource_class.'),
    cfg.StrOpt('vfio_vgpu_resource_class', default=report.VFIO_VGPU_RC,
               help='Placement resource class of one NVIDIA vGPU on a '
                    'vendor-specific VFIO virtual function (vGPU 17+): the '
                    'resource_class the compute nodes\' [pci] device_spec '
                    'gives those VFs, whatever vGPU type is preset on '
                    'them. Nova pools the VFs of one GPU in one provider; '
                    'GpuFilter picks the pool whose type fits the flavor.'),
    cfg.StrOpt('vfio_vgpu_alias', default=report.VFIO_VGPU_ALIAS,
               help='Name of the [pci] alias that asks for vendor-VFIO '
                    'vGPUs: flavors with gpu:backend=vfio carry '
                    'pci_passthrough:alias=<this>:<count>. Its '
                    'resource_class must be vfio_vgpu_resource_class.'),
    cfg.StrOpt('vgpu_backend', default='mdev',
               choices=[('mdev', 'mediated devices (PF or SR-IOV VF '
                                 'parents, resources:VGPU)'),
                        ('vfio', 'NVIDIA vendor-specific VFIO VFs tracked '
                                 'by PCI in Placement '
                                 '(pci_passthrough:alias)')],
               help='How vGPUs are asked when a flavor has no gpu:backend '
                    'key: the path most of the cloud\'s vGPU hosts use. '
                    'Read by the API validator and by nova-scheduler; set '
                    'it the same for both.'),
    cfg.BoolOpt('report_listener', default=True,
                help='Start an oslo.messaging notification listener in '
                     'nova-scheduler that receives the GPU reports of '
                     'nova-gpu-agent (topic [gpu_scheduler] report_topic, '
                     'on the notification transport of nova.conf).'),
    cfg.StrOpt('report_topic', default=report.TOPIC,
               help='Notification topic the agents publish GPU reports on.'),
    cfg.IntOpt('generation_reset_after',
               default=report.GENERATION_RESET_AFTER, min=1,
               help='Seconds after which a GPU report whose generation is '
                    'lower than the one the view holds for that host is '
                    'accepted anyway (logged at WARNING). Within this '
                    'time such a report is an out-of-order delivery and '
                    'is ignored; after it, the agent\'s generations went '
                    'back (its clock was ahead and was set back), and '
                    'ignoring them would freeze the host\'s view. A '
                    'report from a new agent run (another boot_id) is '
                    'accepted at once. Keep it above the agent\'s '
                    'reconcile_interval.'),
    cfg.IntOpt('max_gpu_count', default=8, min=1, max=8,
               help='The most GPU devices one flavor may ask with '
                    'gpu:count. Each device is one Placement request '
                    'group; with the set traits the flavors ask '
                    '(doc/source/scheduler.rst, "Multi-GPU flavors and '
                    'Placement") Placement walks at most (G-N+1)**N '
                    'combinations per host of G GPUs, one provider per GPU '
                    'on every path, which lists 8 devices on an 8-GPU host '
                    'in well under a second. Flavors without them (plain '
                    'resourcesN groups) cost providers**N per host: '
                    'minutes for 4 vGPUs where Nova makes one provider per '
                    'VF, so lower this where such flavors must stay. Read '
                    'by the API validator in nova-api and by '
                    'nova-scheduler: set it the same for both.'),
    cfg.StrOpt('candidate_order', default='every_host',
               choices=[('every_host', 'What GpuFilter does.'),
                        ('selected_host', 'Ignored: as every_host.')],
               deprecated_for_removal=True,
               deprecated_since='2026.2',
               deprecated_reason='GpuFilter reads and orders every host\'s '
                                 'allocation candidates: the end-to-end '
                                 'select_destinations benchmark showed the '
                                 'plugin within its cost targets without '
                                 'the selected_host mode '
                                 '(doc/source/benchmarks.rst).',
               help='Ignored. GpuFilter reads every host\'s Placement '
                    'allocation candidates and puts them in order: a host '
                    'none of whose candidates can serve the request is '
                    'refused with its reason, and the weighers weigh each '
                    'host by the best GPU set Placement offered it.'),
    cfg.IntOpt('pci_candidates_per_host', default=3, min=0,
               help='How many allocation candidates of each host '
                    'GpuCandidateCutFilter keeps for a request with PCI '
                    'devices (whole GPUs, vendor-VFIO vGPUs), before Nova\'s '
                    'NUMATopologyFilter and PciPassthroughFilter check each '
                    'candidate (milliseconds each): the best ones in '
                    'GpuFilter\'s order (of equally good ones, that many '
                    'from where the request\'s draw falls). Nova claims '
                    'candidate 0 of a host, so '
                    'placements stay the same whenever one of those passes '
                    'Nova\'s PCI check, that is whenever nova-compute\'s PCI '
                    'tracker agrees with Placement. 0: keep every '
                    'candidate. Multi-create requests keep every '
                    'candidate. See doc/source/scheduler.rst.'),
    cfg.IntOpt('pending_claim_ttl', default=300, min=1,
               help='Seconds a GPU placement the scheduler just chose is '
                    'counted in its view before the host\'s next report '
                    'confirms it. Only preferences depend on it: Placement '
                    'decides whether a claim succeeds.'),
    cfg.IntOpt('claim_retries', default=5, min=0, max=10,
               help='How many more times nova-scheduler schedules a GPU '
                    'request whose every Placement claim was refused '
                    'although GpuFilter passed a host that could serve it: '
                    'other scheduler services took those devices between '
                    'Placement offering them and Nova claiming them (Nova '
                    'claims only candidate 0 of each host, and every '
                    'scheduler computes the same alternates). Each retry '
                    'asks Placement for fresh allocation candidates after '
                    'a random wait (at most 0.1 s, doubling each time); '
                    'while the request races other schedulers, a retry '
                    'that gets NoValidHost is retried too, until it is '
                    'placed or the retries run out. A request no host can '
                    'serve gets NoValidHost at once, as before. 0: Nova\'s '
                    'behaviour, NoValidHost after the first attempt.'),
    cfg.FloatOpt('claim_retry_seconds', default=10.0, min=0.0,
                 help='No retry of a GPU request whose claims were lost '
                      '(claim_retries) starts later than this many seconds '
                      'per instance of the request (a multi-create of N '
                      'servers: N times this) after its first attempt '
                      'started; the request then gets NoValidHost. Bounds '
                      'the time one request can hold a scheduler worker '
                      '(the conductor waits up to [DEFAULT] '
                      'long_rpc_timeout for it).'),
    cfg.IntOpt('demand_window', default=1000, min=1,
               help='How many recent GPU requests form the demand '
                    'distribution the fragmentation measure uses.'),
    cfg.IntOpt('demand_refresh_interval', default=300, min=1,
               help='Seconds between rebuilds of the demand distribution '
                    'from the recent requests. Every rebuild makes the '
                    'next request score each host state afresh, so keep it '
                    'in minutes on large clouds.'),
    cfg.IntOpt('demand_publish_interval', default=300, min=0,
               help='Least seconds between two publications of the demand '
                    'distribution (notification gpu.demand.updated on '
                    'demand_topic), which the agents\' layout planners '
                    'carve idle GPUs to ([gpu_agent] carve_enabled). A '
                    'distribution rebuilt sooner is sent with the first '
                    'request after the interval. 0 publishes nothing.'),
    cfg.StrOpt('demand_topic', default=notification.DEMAND_TOPIC,
               help='Notification topic the demand distribution is '
                    'published on, for the agents ([gpu_agent] '
                    'demand_topic). Not the report topic: each agent '
                    'listens in a pool of its own.'),
    cfg.IntOpt('notification_queue_size', default=1000, min=1,
               help='Most nova-gpu notifications (refusals, placements, '
                    'demand publications) nova-scheduler holds while its '
                    'background sender waits on the broker. Scheduling '
                    'only queues them and never waits; when the queue is '
                    'full the oldest one is dropped, counted and logged '
                    'at WARNING (at most once a minute). One takes about '
                    '2 KiB of memory.'),
    cfg.MultiStrOpt('typical_requests', default=[],
                    help='Typical GPU requests, one per line, each written '
                         'as extra specs separated by ";", e.g. '
                         '"gpu:profile=A100-10C;gpu:count=1". Together they '
                         'weigh as much as the requests observed so far, '
                         'so that fragmentation is measured against them '
                         'from the first request on.'),
    cfg.StrOpt('rdma_locality', default='pcie-switch',
               choices=[
                   ('pcie-switch', 'each GPU\'s NIC function below the '
                                   'same PCIe switch (GPUDirect RDMA '
                                   'traffic stays in the switch; a switch '
                                   'whose ports redirect peer-to-peer '
                                   'traffic through ACS pairs nothing)'),
                   ('root-complex', 'each GPU\'s NIC function below the '
                                    'same PCIe root complex (for hosts '
                                    'whose GPUs and NICs share no switch)')],
               help='Where a flavor with gpu:rdma=true places the RDMA NIC '
                    'function (VF) of each GPU (nova_gpu.core.rdma), from '
                    'the PCIe tree the agents report ([gpu_agent] '
                    'report_pcie_tree). Also where GPU-NIC pairs are '
                    'counted when any GPU request is ranked: a choice that '
                    'breaks fewer free pairs is preferred. Read by the API '
                    'validator in nova-api and by nova-scheduler.'),
    cfg.StrOpt('rdma_nic_alias', default=report.RDMA_NIC_ALIAS,
               help='The [pci] alias of the RDMA NIC functions (ConnectX '
                    'VFs in [pci] device_spec) that gpu:rdma=true flavors '
                    'ask one of per GPU in pci_passthrough:alias '
                    '(<alias>:<gpu:count>). The same alias must be in the '
                    'nova.conf of nova-api, nova-conductor, '
                    'nova-scheduler and nova-compute.'),
]


def register_opts(conf):
    conf.register_group(group)
    conf.register_opts(opts, group=group)


def list_opts():
    return [(group, opts)]
