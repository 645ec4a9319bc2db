"""The feature gates the stock kubelet of 1.37 knows: its --feature-gates and a KubeletConfiguration's
featureGates take any of these names, and refuse any other ("unrecognized feature gate"), so a file that
one kubelet takes is taken by the other.

The names are those registered in the kubelet's feature gate: Kubernetes' own (pkg/features/kube_features.go,
with the apiserver's, apiextensions', controller-manager's and zpages' gates it lists), client-go's, the
logging options' (component-base/logs/api/v1) and the two global toggles AllAlpha and AllBeta. None of them
switches anything in pykubelet, whose behaviour is its own: they are known, so that a name is checked, and
kept in the settings.
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


def feature_gates(value: Any) -> dict[str, bool]:
    """featureGates: a known gate name -> true or false."""
    if not isinstance(value, dict):
        raise ValueError(f"a map of feature gate names to true or false, got {value!r}")
    for name, enabled in value.items():
        if name not in KNOWN:
            raise ValueError(f"a known feature gate: unrecognized feature gate: {name}")
        if not isinstance(enabled, bool):
            raise ValueError(f"true or false for feature gate {name}, got {enabled!r}")
    return dict(value)
