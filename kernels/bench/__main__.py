from kernels.bench.gae import main

main()
