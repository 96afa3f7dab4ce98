// fna-bench, the executable: see main.cpp.
int fna_bench_main(int argc, char** argv);

int main(int argc, char** argv) { return fna_bench_main(argc, argv); }
