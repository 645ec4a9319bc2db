"""The feature gates the stock kubelet of 1.37 knows: its --feature-gates and a KubeletConfiguration's
featureGates take any of these names, and refuse any other ("unrecognized feature gate"), so a file that
one kubelet takes is taken by the other.

The names are those registered in the kubelet's feature gate: Kubernetes' own (pkg/features/kube_features.go,
with the apiserver's, apiextensions', controller-manager's and zpages' gates it lists), client-go's, the
logging options' (component-base/logs/api/v1) and the two global toggles AllAlpha and AllBeta; and those of
them that 1.37 locks to their default (LockToDefault in their specs) take no other value. None of them
switches anything in pykubelet, whose behaviour is its own, but what the node declares of the features it
implements (pykubelet/node/features.py): they are known, so that a name is checked, and kept in the settings.

KNOWN and LOCKED are generated from the Go module sources by scripts/gen-featuregates.py; for another
release, build the peers at it and run `.venv/bin/python scripts/gen-featuregates.py --k8s vX.Y.Z`, which
rewrites them in place (this docstring's release is edited by hand).
"""
from __future__ import annotations

from typing import Any

KNOWN = frozenset((
    "APIResponseCompression", "APIServerIdentity", "APIServerWebhookAuthenticationToken", "APIServingWithRoutine",
    "AggregatedDiscoveryRemoveBetaType", "AllAlpha", "AllBeta", "AllowDNSOnlyNodeCSR",
    "AllowInsecureKubeletCertificateSigningRequests", "AllowOverwriteTerminationGracePeriodSeconds",
    "AllowParsingUserUIDFromCertAuth", "AllowServiceExternalIPs", "AllowUnsafeMalformedObjectDeletion", "AtomicFIFO",
    "AtomicWriteVolumeUserFields", "AuthorizePodWebsocketUpgradeCreatePermission", "CBORServingAndStorage",
    "CPUManagerPolicyAlphaOptions", "CPUManagerPolicyBetaOptions", "CPUManagerPolicyOptions",
    "CRDObservedGenerationTracking", "CRDValidationRatcheting", "CRIListStreaming", "CSIServiceAccountTokenSecrets",
    "CSIVolumeHealth", "ChangeContainerStatusOnKubeletRestart", "ClearingNominatedNodeNameAfterBinding",
    "ClientsAllowCARotation", "ClientsAllowCBOR", "ClientsAllowTLSCacheGC", "ClientsPreferCBOR",
    "CloudControllerManagerWatchBasedRoutesReconciliation", "CloudControllerManagerWebhook", "ClusterTrustBundle",
    "ClusterTrustBundleProjection", "ComponentFlagz", "ComponentStatusz", "CompositePodGroup",
    "ConcurrentWatchObjectDecode", "ConsistentListFromCacheSkipTimeoutFallback", "ConstrainedImpersonation",
    "ContainerCheckpoint", "ContainerRestartRules", "ContainerStopSignals", "ContextualLogging",
    "CoordinatedLeaderElection", "CrossNamespaceVolumeDataSource", "CustomCPUCFSQuotaPeriod",
    "CustomResourceFieldSelectors", "DRAAdminAccess", "DRAConsumableCapacity", "DRADerivedAttributes",
    "DRADeviceBindingConditions", "DRADeviceCompatibilityGroups", "DRADeviceTaintRules", "DRADeviceTaints",
    "DRAExtendedResource", "DRAFractionalCapacityRange", "DRAListTypeAttributes", "DRANodeAllocatableResources",
    "DRAOptionalNodeOperations", "DRAPartitionableDevices", "DRAPartitionableDevicesType", "DRAPrioritizedList",
    "DRAResourceClaimDeviceStatus", "DRAResourceClaimGranularStatusAuthorization", "DRAResourcePoolStatus",
    "DRASchedulerFilterTimeout", "DRAWorkloadResourceClaims", "DeclarativeValidation", "DeclarativeValidationBeta",
    "DeclarativeValidationTakeover", "DefaultPodSysctls", "DeploymentReplicaSetTerminatingReplicas",
    "DetectCacheInconsistency", "DisableAllocatorDualWrite", "DisableCPUQuotaWithExclusiveCPUs",
    "DisableNodeKubeProxyVersion", "DynamicResourceAllocation", "EmptyDirVolumeMode", "EnvFiles", "EtcdRangeStream",
    "EventedPLEG", "EvictionRequestAPI", "ExcludeAdmissionWebhookVirtualResources", "ExecProbeTimeout",
    "ExtendWebSocketsToKubelet", "ExternalServiceAccountTokenSigner", "GRPCContainerProbeTLS", "GenericWorkload",
    "GitRepoVolumeDriver", "GracefulNodeShutdown", "GracefulNodeShutdownBasedOnPodPriority", "H2CContainerProbe",
    "HPAConfigurableTolerance", "HPAGeneration", "HPAOptimizedSelectorStore", "HPAScaleToZero", "HostnameOverride",
    "HugepageAwareEviction", "ImageMaximumGCAge", "ImageVolume", "ImageVolumeWithDigest", "InOrderInformers",
    "InOrderInformersBatchProcess", "InPlacePodLevelResourcesVerticalScaling", "InPlacePodVerticalScaling",
    "InPlacePodVerticalScalingExclusiveCPUs", "InPlacePodVerticalScalingExclusiveMemory",
    "InPlacePodVerticalScalingInitContainers", "InPlacePodVerticalScalingMemoryBackedVolumes",
    "InPlacePodVerticalScalingSchedulerPreemption", "InformerResourceVersion", "InterPodAffinityHostnameFastPath",
    "JobManagedBy", "KMSv1", "KubeProxyIPVS", "KubeProxyNFTablesLocalhostNodePorts", "KubeletAllocatedPodsEndpoint",
    "KubeletCgroupDriverFromCRI", "KubeletCrashLoopBackOffMax", "KubeletEnsureSecretPulledImages",
    "KubeletFineGrainedAuthz", "KubeletInUserNamespace", "KubeletPSI", "KubeletPodResourcesDynamicResources",
    "KubeletPodResourcesGet", "KubeletPodResourcesListUseActivePods", "KubeletRegistrationGetOnExistsOnly",
    "KubeletSeparateDiskGC", "KubeletServiceAccountTokenForCredentialProviders", "KubeletTracing",
    "ListFromCacheSnapshot", "LocalStorageCapacityIsolationFSQuotaMonitoring", "LoggingAlphaOptions",
    "LoggingBetaOptions", "ManifestBasedAdmissionControlConfig", "MatchLabelKeysInPodAffinity",
    "MatchLabelKeysInPodTopologySpread", "MatchLabelKeysInPodTopologySpreadSelectorMerge",
    "MaxUnavailableStatefulSet", "MemoryQoS", "MultiCIDRServiceAllocator", "MutableCSINodeAllocatableCount",
    "MutablePVNodeAffinity", "MutablePodResourcesForSuspendedJobs", "MutableSchedulingDirectivesForSuspendedJobs",
    "MutatingAdmissionPolicy", "NFTablesNetlink", "NFTablesProxyMode", "NodeControllerLeaseCircuitBreaker",
    "NodeDeclaredFeatures", "NodeInclusionPolicyInPodTopologySpread", "NodeLifecycleConditions", "NodeLogQuery",
    "NodeSwap", "NominatedNodeNameForExpectation", "OpenAPIEnums", "OpportunisticBatching", "PLEGOnDemandRelist",
    "PersistentVolumeClaimUnusedSinceTime", "PodAndContainerStatsFromCRI", "PodCertificateRequest",
    "PodDeletionCost", "PodGroupPreemptionPolicy", "PodLevelResourceManagers", "PodLevelResources",
    "PodLevelResourcesFixDefaulting", "PodLevelResourcesFixKubeletQOSClass", "PodLogsQuerySplitStreams",
    "PodObservedGenerationTracking", "PodReadyToStartContainersCondition", "PodSchedulingReadiness",
    "PodTopologyLabelsAdmission", "PodsAPI", "PortForwardWebsockets", "PreferSameTrafficDistribution",
    "ProcMountType", "QOSReserved", "RecoverVolumeExpansionFailure", "RecursiveReadOnlyMounts",
    "ReduceDefaultCrashLoopBackOffDecay", "RelaxedEnvironmentVariableValidation", "RelaxedServiceNameValidation",
    "ReloadKubeletClientCAFile", "ReloadKubeletServerCertificateFile", "RemoteRequestHeaderUID",
    "ResourceHealthStatus", "ResourceHealthStatusMessage", "RestartAllContainersOnContainerExits",
    "RotateKubeletServerCertificate", "RuntimeClassInImageCriApi", "SELinuxChangePolicy", "SELinuxMount",
    "SELinuxMountReadWriteOncePod", "SchedulerAsyncAPICalls", "SchedulerAsyncPreemption", "SchedulerPopFromBackoffQ",
    "SchedulerPreQueueingHints", "SeparateCacheWatchRPC", "SeparateTaintEvictionController",
    "ServiceAccountNodeAudienceRestriction", "ServiceAccountTokenJTI", "ServiceAccountTokenNodeBinding",
    "ServiceAccountTokenNodeBindingValidation", "ServiceAccountTokenPodNodeInfo", "ServiceCIDRStatusFieldWiping",
    "ShardedListAndWatch", "SizeBasedListCostEstimate", "StaleControllerConsistencyDaemonSet",
    "StaleControllerConsistencyHPA", "StaleControllerConsistencyJob", "StaleControllerConsistencyReplicaSet",
    "StaleControllerConsistencyStatefulSet", "StatefulSetRecreateStrategy", "StatefulSetSemanticRevisionComparison",
    "StorageCapacityScoring", "StorageNamespaceIndex", "StorageVersionAPI", "StorageVersionHash",
    "StorageVersionMigrator", "StrictIPCIDRValidation", "StructuredAuthenticationConfigurationEgressSelector",
    "StructuredAuthenticationConfigurationJWKSMetrics", "SupplementalGroupsPolicy", "SystemdWatchdog",
    "TaintTolerationComparisonOperators", "TokenRequestServiceAccountUIDValidation",
    "TopologyAwareWorkloadScheduling", "TopologyManagerPolicyAlphaOptions", "TopologyManagerPolicyBetaOptions",
    "TopologyManagerPolicyOptions", "TranslateStreamCloseWebsocketRequests", "UnauthenticatedHTTP2DOSMitigation",
    "UnknownVersionInteroperabilityProxy", "UnlockWhileProcessingFIFO", "UserNamespacesHostNetworkSupport",
    "UserNamespacesSupport", "VolumeAttributesClass", "VolumeBindMountOptions", "VolumeLimitScaling",
    "WatchCacheInitializationPostStartHook", "WatchList", "WatchListClient", "WatchListCompression",
    "WebhookRoundTripLoadBalancing", "WinDSR", "WinOverlay", "WindowsCPUAndMemoryAffinity",
    "WindowsGracefulNodeShutdown", "WindowsHostNetwork", "WorkloadWithJob",
))

# the gates locked to their default in 1.37 (GA ones, and deprecated ones on their way out): another value is
# refused, as by the stock kubelet
LOCKED = {
    "AggregatedDiscoveryRemoveBetaType": True, "AllowOverwriteTerminationGracePeriodSeconds": False,
    "CPUManagerPolicyOptions": True, "CRDValidationRatcheting": True, "CSIServiceAccountTokenSecrets": True,
    "CustomResourceFieldSelectors": True, "DRAAdminAccess": True, "DRAExtendedResource": True,
    "DRAPrioritizedList": True, "DRAResourceClaimDeviceStatus": True, "DeclarativeValidation": True,
    "DeclarativeValidationTakeover": False, "DisableAllocatorDualWrite": True,
    "DisableCPUQuotaWithExclusiveCPUs": True, "DisableNodeKubeProxyVersion": True, "DynamicResourceAllocation": True,
    "ExecProbeTimeout": True, "ExternalServiceAccountTokenSigner": True, "GitRepoVolumeDriver": False,
    "HPAConfigurableTolerance": True, "HostnameOverride": True, "ImageMaximumGCAge": True, "ImageVolume": True,
    "InOrderInformers": True, "InPlacePodVerticalScaling": True, "InPlacePodVerticalScalingInitContainers": True,
    "JobManagedBy": True, "KubeletCgroupDriverFromCRI": True, "KubeletFineGrainedAuthz": True, "KubeletPSI": True,
    "KubeletPodResourcesDynamicResources": True, "KubeletPodResourcesGet": True, "KubeletTracing": True,
    "MatchLabelKeysInPodAffinity": True, "MultiCIDRServiceAllocator": True, "MutableCSINodeAllocatableCount": True,
    "NFTablesProxyMode": True, "NodeDeclaredFeatures": True, "NodeInclusionPolicyInPodTopologySpread": True,
    "NodeLogQuery": True, "NodeSwap": True, "PLEGOnDemandRelist": True, "PodObservedGenerationTracking": True,
    "PodReadyToStartContainersCondition": True, "PodSchedulingReadiness": True,
    "PreferSameTrafficDistribution": True, "ProcMountType": True, "RecoverVolumeExpansionFailure": True,
    "RecursiveReadOnlyMounts": True, "RelaxedEnvironmentVariableValidation": True,
    "RelaxedServiceNameValidation": True, "SELinuxChangePolicy": True, "SELinuxMountReadWriteOncePod": True,
    "SeparateCacheWatchRPC": False, "SeparateTaintEvictionController": True, "ServiceAccountTokenJTI": True,
    "ServiceAccountTokenNodeBinding": True, "ServiceAccountTokenNodeBindingValidation": True,
    "ServiceAccountTokenPodNodeInfo": True, "SupplementalGroupsPolicy": True, "SystemdWatchdog": True,
    "TopologyManagerPolicyOptions": True, "UserNamespacesSupport": True, "VolumeAttributesClass": True,
    "WatchCacheInitializationPostStartHook": True, "WinDSR": True, "WinOverlay": True,
}


def feature_gates(value: Any) -> dict[str, bool]:
    """featureGates: a known gate name -> true or false."""
    if not isinstance(value, dict):
        raise ValueError(f"a map of feature gate names to true or false, got {value!r}")
    for name, enabled in value.items():
        if name not in KNOWN:
            raise ValueError(f"a known feature gate: unrecognized feature gate: {name}")
        if not isinstance(enabled, bool):
            raise ValueError(f"true or false for feature gate {name}, got {enabled!r}")
        if LOCKED.get(name, enabled) != enabled:
            raise ValueError(f"{str(LOCKED[name]).lower()} for feature gate {name}: cannot set feature gate "
                             f"{name} to {str(enabled).lower()}, feature is locked to {str(LOCKED[name]).lower()}")
    return dict(value)
