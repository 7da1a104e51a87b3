"""Options of the nova-gpu compute agent: ``[gpu_agent]``."""

from oslo_config import cfg
from oslo_config import types

from nova_gpu.core import notification
from nova_gpu.core import report

agent_group = cfg.OptGroup(
    'gpu_agent', title='nova-gpu compute agent',
    help='Options of nova-gpu-agent, the service that runs beside '
         'nova-compute on every GPU host, and of the nova-gpu helper CLI.')

opts = [
    cfg.StrOpt('host', sample_default='<hostname>',
               help='Name of this compute host as nova-compute reports it '
                    '(its [DEFAULT] host). Defaults to the hostname.'),
    cfg.StrOpt('nodename', sample_default='<host>',
               help='Hypervisor node name, used to name the Placement '
                    'resource providers of the GPUs as nova-compute does '
                    '("<nodename>_pci_<address>" for mdev parents, '
                    '"<nodename>_<ADDRESS>" for PCI in Placement). '
                    'Defaults to host.'),
    cfg.ListOpt('pci_resource_classes', default=[],
                help='Resource class of GPUs and VFs tracked by PCI in '
                     'Placement, as nova-compute\'s [pci] device_spec '
                     'resource_class tags set them. Key: a PF address '
                     '(0000:86:00.0), a catalog vGPU type (H100-20C) or a '
                     'PCI product id (2330); value: the resource class '
                     '(normalised as Nova does, CUSTOM_ added), e.g. '
                     '"0000:86:00.0:CUSTOM_NVIDIA_VGPU,2330:NVIDIA_GPU" '
                     '(the last colon of an entry separates key and '
                     'value). Without an entry: Nova\'s default '
                     'CUSTOM_PCI_<vendor>_<product>.'),
    cfg.StrOpt('libvirt_uri', default='qemu:///system',
               help='libvirt connection URI used for node devices and '
                    'domains.'),
    cfg.BoolOpt('vf_types_on_demand', default=False,
                help='nova-gpu-qemu-hook is installed in libvirt: a '
                     'vendor-VFIO VF holds a vGPU type only while a guest '
                     'holds the VF (typed when libvirt prepares the guest, '
                     'cleared when it releases it). The agent then counts '
                     'every typed VF as a vGPU in use, also when libvirt '
                     'cannot tell which domain holds it, and the '
                     'orphan pass clears the type of a VF no domain '
                     'references (as with "vf_type" in orphan_kinds: a '
                     'guest start cut short leaves one). Leave it off '
                     'where VF types are preset: a typed VF is then free '
                     'until a domain references it.'),
    cfg.StrOpt('sysfs_root', default='/sys',
               help='Where sysfs is mounted. Only tests change this.'),
    cfg.BoolOpt('use_nvml', default=True,
                help='Read GPUs through NVML (pynvml). Hosts without the '
                     'NVIDIA driver work without it: discovery then uses '
                     'sysfs and libvirt only.'),
    cfg.IntOpt('reconcile_interval', default=60, min=0,
               help='Seconds between two reconcile passes (adopt devices, '
                    'start persistent mdevs, remove orphans) and reports. '
                    '0 runs once at start only.'),
    cfg.BoolOpt('remove_orphans', default=True,
                help='Remove GPU devices nothing uses: mediated devices '
                     'and SR-IOV VFs with a vGPU type that no defined '
                     'libvirt domain references, and MIG GPU instances '
                     'with no vGPU on them. A device referenced by any '
                     'domain, running or not, is never touched. Devices '
                     'that an agent operation cut short by a crash left '
                     'half-made are rolled back whatever this says.'),
    cfg.ListOpt('orphan_kinds', default=['mdev'],
                item_type=types.String(
                    choices=('mdev', 'vf_type', 'mig_instance')),
                help='Which unused devices remove_orphans removes: '
                     '"mdev" (mediated devices; Nova makes and reuses them '
                     'itself), "vf_type" (the vGPU type of vendor-VFIO VFs '
                     'no domain references) and "mig_instance" (MIG GPU '
                     'instances with no vGPU). Only mdevs by default: with '
                     'NVIDIA vendor-specific VFIO the VF types of a PCI in '
                     'Placement pool are set before any guest asks (Nova\'s '
                     'PCI tracker picks a VF of the pool), and MIG layouts '
                     'are made ahead by the operator or the layout planner; '
                     'removing them would take capacity away. Add '
                     '"vf_type" only where types are set just in time for '
                     'each guest.'),
    cfg.IntOpt('orphan_grace_period', default=300, min=0,
               help='Seconds a device must have been seen unused before '
                    'it counts as an orphan, so that a device nova-compute '
                    'just created for a guest that is still being defined '
                    'is left alone. The first-seen times are kept in the '
                    'journal in state_dir, so agent restarts do not reset '
                    'them.'),
    cfg.StrOpt('state_dir', default='/var/lib/nova-gpu',
               help='Directory of the agent\'s durable state: the intent '
                    'journal (journal.json), where every device change is '
                    'recorded before it starts and dropped once it is '
                    'done, so that reconcile rolls back what a crash cut '
                    'short, and the orphan first-seen times. Empty keeps '
                    'them in memory only (nothing survives a restart).'),
    cfg.FloatOpt('device_timeout', default=10.0, min=0.1,
                 help='Seconds to wait for a device to appear in or '
                      'disappear from sysfs after asking for it.'),
    cfg.IntOpt('libvirt_retries', default=3, min=0,
               help='How often to retry a libvirt call that failed '
                    'because libvirtd is not reachable.'),
    cfg.StrOpt('provider_config_file',
               default='/etc/nova/provider_config/nova-gpu.yaml',
               help='Provider config YAML written for nova-compute '
                    '([compute] provider_config_location must include its '
                    'directory). It carries the GPU topology traits, '
                    'which stick across nova-compute\'s periodic provider '
                    'updates. Empty disables it.'),
    cfg.BoolOpt('quota_inventory', default=False,
                help='Also put the GPU quota resource classes '
                     '(CUSTOM_GPU_QUOTA_<MODEL>_VGPU, _<MODEL>_WHOLE and '
                     'CUSTOM_GPU_QUOTA_MEMORY_MB, nova_gpu.core.quota) on '
                     'the compute node\'s root provider, through '
                     'provider_config_file, so that Nova\'s unified limits '
                     'can cap a project\'s GPUs per model and its GPU '
                     'memory. Enable it on every GPU host before flavors '
                     'ask those classes (openstack gpu flavor keys '
                     '--quota): a host without them has no room for such '
                     'flavors. Restart nova-compute after the file '
                     'changed. See doc/source/quotas.rst.'),
    cfg.StrOpt('report_topic', default=report.TOPIC,
               help='oslo.messaging notification topic of host GPU '
                    'reports.'),
    cfg.StrOpt('report_exchange', default='nova',
               help='Exchange of the report notifications. nova-scheduler '
                    '(where the nova-gpu scheduler plugin listens) uses '
                    'Nova\'s control exchange, "nova".'),
    cfg.StrOpt('outbox_dir', default='/var/lib/nova-gpu/outbox',
               help='Reports that could not be sent (broker down) are '
                    'kept here and sent again, oldest first.'),
    cfg.IntOpt('outbox_max', default=100, min=1,
               help='Most unsent reports kept; older ones are dropped '
                    'first, since a newer report supersedes them.'),
    cfg.StrOpt('placement_cloud',
               help='clouds.yaml entry (openstacksdk) used to read the GPU '
                    'resource providers from Placement, to add their UUIDs '
                    'to the report and log the ones nova-compute has not '
                    'created yet, and to keep the set traits of multi-GPU '
                    'flavors on one free VF of each GPU whose VFs are '
                    'providers (SR-IOV + mdev: A100/H100 vGPU 16, '
                    'MIG-backed vGPUs); the only write the agent makes. '
                    'Needs a user that may read providers and set their '
                    'traits (the placement service user, or admin). '
                    'Unset: Placement is not read, and multi-GPU flavors '
                    'find no candidate on such GPUs.'),
    cfg.IntOpt('heads_interval', default=5, min=0,
               help='Seconds between the quick passes that move the set '
                    'traits of multi-GPU flavors off VFs guests took, on '
                    'GPUs whose VFs are providers (needs placement_cloud): '
                    'until then such a GPU takes no new multi-GPU server '
                    'beyond its other heads. One Placement request per '
                    'pass when nothing moved. 0: only at each '
                    'reconcile_interval cycle.'),
    cfg.StrOpt('metrics_listen', default='',
               sample_default='127.0.0.1:9835',
               help='ADDRESS:PORT where the agent serves Prometheus '
                    'metrics of this host\'s GPUs, devices and its own '
                    'health (http://ADDRESS:PORT/metrics; [::1]:9835 for '
                    'IPv6). Empty (the default) serves nothing. See '
                    'doc/source/observability.rst for the series.'),
    cfg.BoolOpt('carve_enabled', default=False,
                help='Carve to demand: run the layout planner '
                     '(nova_gpu.core.layout) on this host\'s idle GPUs '
                     'every carve_interval seconds and make its layouts '
                     '(MIG GPU instances through NVML, vGPU types and '
                     'passthrough recorded for the just-in-time type and '
                     'the restore at boot). A GPU, GPU instance or device '
                     'in use is never touched. See '
                     'doc/source/carving.rst.'),
    cfg.IntOpt('carve_interval', default=300, min=0,
               help='Least seconds between two plans of the layout '
                    'planner; it runs within the agent\'s cycle, so at '
                    'most once per reconcile_interval. 0 plans at every '
                    'cycle.'),
    cfg.StrOpt('carve_demand_source', default='scheduler',
               choices=[('scheduler', 'the demand the schedulers publish '
                                      '(gpu.demand.updated on '
                                      'demand_topic), carve_static_demand '
                                      'until one arrives or when it is '
                                      'older than carve_demand_max_age'),
                        ('static', 'carve_static_demand only')],
               help='Where the demand the planner carves to comes from.'),
    cfg.StrOpt('demand_topic', default=notification.DEMAND_TOPIC,
               help='Notification topic (on report_exchange) where the '
                    'schedulers publish the demand ([gpu_scheduler] '
                    'demand_topic). The agent listens in a pool named '
                    'after its host.'),
    cfg.ListOpt('carve_static_demand', default=[],
                sample_default='vgpu:A100-10C=3,mig:1g.10gb=1,whole:1=1',
                help='Demand used without a published one: '
                     'KIND:PROFILE=WEIGHT items (kind vgpu with a vGPU '
                     'type, mig with a MIG profile) or whole:COUNT=WEIGHT '
                     '(COUNT whole GPUs). Weights are shares of arrivals. '
                     'Empty: without a published demand nothing is '
                     'carved.'),
    cfg.IntOpt('carve_demand_max_age', default=3600, min=0,
               help='Seconds after which a published demand no longer '
                    'counts (the schedulers stopped publishing): the '
                    'planner then uses carve_static_demand. 0: a '
                    'published demand never expires.'),
    cfg.FloatOpt('carve_hysteresis', default=0.25, min=0,
                 help='A GPU with a layout is re-carved only when the '
                      'scarcest demand class gains by this factor (0.25: '
                      '25%), so that near-equal plans do not flap.'),
    cfg.IntOpt('carve_min_hold', default=600, min=0,
               help='Seconds an idle GPU keeps its layout before it may be '
                    're-carved (counted from the agent\'s start for '
                    'layouts made before it).'),
    cfg.BoolOpt('carve_switch_mig_mode', default=False,
                help='Let carve to demand switch an idle MIG-capable GPU '
                     'into MIG mode for a MIG layout, and out of it for a '
                     'time-sliced vGPU type or passthrough (its idle GPU '
                     'instances removed first). Idle: no GPU instance or '
                     'vGPU on it, no mdev, neither the GPU nor one of its '
                     'VFs in a libvirt domain. NVML resets the GPU to '
                     'activate the mode; where it cannot, the switch stays '
                     'pending until a GPU reset or a reboot, the GPU is '
                     'not carved meanwhile and the agent logs it. Off: a '
                     'GPU keeps the MIG mode the operator set (nvidia-smi '
                     '-mig) and gets only layouts of that mode. The mode '
                     'the agent set is set again at boot by '
                     'nova-gpu-restore (GPUs after Ampere do not keep it '
                     'across a reboot).'),
    cfg.IntOpt('carve_max_changes', default=2, min=0,
               help='Most GPUs with a layout re-carved per plan (GPUs not '
                    'set up yet are always carved).'),
    cfg.FloatOpt('idle_threshold', default=0.05, min=0, max=1,
                 help='A guest GPU device whose use stays under this share '
                      'of its own capacity (NVML utilisation over its share '
                      'of the GPU: 0.05 is 5%) for idle_after seconds is '
                      'reported idle, with a right-sizing suggestion '
                      '(nova_gpu.core.idle). Read once per agent cycle. 0 '
                      'turns idle detection off.'),
    cfg.IntOpt('idle_after', default=1800, min=60,
               help='Seconds a guest GPU device must stay under '
                    'idle_threshold before it is reported idle (30 '
                    'minutes by default). A device NVML cannot read is '
                    'never reported idle, nor one whose readings stop for '
                    'longer than twice reconcile_interval (at least 5 '
                    'minutes).'),
    cfg.StrOpt('nvswitch_mode', default='none',
               help='Fabric Manager virtualization model of this HGX host. '
                    'In shared mode the agent reports the partitions Fabric '
                    'Manager lists (nova_gpu.core.partitions), the qemu '
                    'hook activates the partition of a passthrough guest\'s '
                    'GPUs before it starts and deactivates it when it '
                    'stops, and each agent cycle deactivates partitions of '
                    'guests that are gone and sets the activated list '
                    'again after a Fabric Manager restart.',
               choices=[
                   ('none', 'no NVSwitch partitions: whole GPUs go to '
                            'guests in any set (no NVSwitch, or Fabric '
                            'Manager\'s full passthrough model)'),
                   ('shared', 'Fabric Manager\'s Shared NVSwitch model: '
                              'a guest gets only GPUs forming a free '
                              'partition, activated before it starts')]),
    cfg.StrOpt('fmpm_path', default='fmpm',
               help='NVIDIA\'s Fabric Manager partition tool (fmpm, '
                    'github.com/NVIDIA/Fabric-Manager-Client), by which '
                    'the agent and the qemu hook call Fabric Manager in '
                    'shared nvswitch_mode.'),
    cfg.StrOpt('fabric_manager_socket', default='',
               help='Unix socket of Fabric Manager (its '
                    'FM_CMD_UNIX_SOCKET_PATH). Empty: fabric_manager_address '
                    'is used.'),
    cfg.StrOpt('fabric_manager_address', default='',
               help='Address of Fabric Manager\'s API (its '
                    'FM_CMD_BIND_INTERFACE) when fabric_manager_socket is '
                    'empty. Empty: fmpm\'s default, 127.0.0.1.'),
    cfg.IntOpt('fabric_manager_timeout', default=30, min=1,
               help='Seconds one Fabric Manager call may take; a guest '
                    'start whose partition cannot be activated in time '
                    'fails.'),
    cfg.BoolOpt('report_pcie_tree', default=False,
                help='Report the host\'s PCIe tree for GPUDirect RDMA '
                     'pairing (nova_gpu.agent.pcie): each GPU\'s PCIe '
                     'switch and root complex, the switches\' ACS state '
                     'and the RDMA NICs (Mellanox/NVIDIA ConnectX PFs with '
                     'SR-IOV VFs) with the VFs guests hold, read from '
                     'sysfs. Flavors with gpu:rdma=true are placed only on '
                     'hosts that report it. ACS is read from the switch '
                     'ports\' config space, which needs root (or '
                     'CAP_SYS_ADMIN); otherwise it is reported unknown '
                     'and treated as not redirecting.'),
]


def register_opts(conf):
    conf.register_group(agent_group)
    conf.register_opts(opts, group=agent_group)


def list_opts():
    return [(agent_group, opts)]
